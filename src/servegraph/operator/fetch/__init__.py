"""The fetch stage: the token and CA from Secrets, the download within its limits, the parse in a child process."""
