"""How real traffic gets into the task log: the proxy, `log_interaction`, the JSONL import and
the transcript harvesters (`harvest/`), with secrets redacted (`redact`) before storage."""
