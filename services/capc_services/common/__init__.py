"""Plumbing shared by the three roles: settings, interceptors, admin REST, metrics, logs, runtime."""
