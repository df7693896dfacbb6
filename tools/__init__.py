"""Developer tools: test-vector generators and the dictionary trainer (not installed with iac)."""
