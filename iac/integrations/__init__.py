"""Optional integrations (imported only when used)."""
