"""Self-contained helpers every room may use: atomic files, plain-text rules, the listening
socket and the HTTP apps' request models, and process-group set-up."""
