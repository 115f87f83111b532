"""How real traffic gets into the task log: the proxy, `log_interaction`, the JSONL import and
the transcript harvesters (`harvest/`), with secrets redacted (`redact`) before storage; and
probation (`probation`), each adopted version judged on the traffic logged since. Above
adoption (the proxy serves what is adopted), below the night (which reads the log)."""
