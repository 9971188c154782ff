"""Deployable DIET-CaPC parties (teacher, student, guardian): thin processes over ``capc_common``."""
