"""Service plumbing shared by the three roles: settings, TLS interceptors, admin REST, metrics, logs, runtime."""
