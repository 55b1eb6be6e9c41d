"""Integrations with frameworks that own their database connection (Django)."""
