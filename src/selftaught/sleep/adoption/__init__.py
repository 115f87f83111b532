"""After a night: stage a proposal, adopt or roll it back (`staging`), and inject the adopted
skill into requests (`inject`). Below the log and the night: it reads what a night leaves
(`sleep.result`, `sleep.records`), never the night's code or the log."""
