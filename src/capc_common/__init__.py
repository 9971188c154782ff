"""DIET-CaPC library: synthetic data, models, privacy accounting, aggregation and secure computation.

The library never imports the services (``capc_services``); the services are thin shells over it.
"""

__version__ = "0.1.0"
