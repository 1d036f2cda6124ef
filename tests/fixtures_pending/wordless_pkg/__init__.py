"""A helper module with no word that names what its callers do with it."""
