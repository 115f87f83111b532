"""After a night: stage a proposal, adopt or roll it back (`staging`), and inject the adopted
skill into requests (`inject`)."""
