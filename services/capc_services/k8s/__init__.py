"""Kubernetes deployment tooling: check a kustomization of ``deploy/k8s`` before ``kubectl apply -k``."""

from capc_services.k8s.check import PLACEHOLDER_REGISTRY, Problem, check_kustomization

__all__ = ["PLACEHOLDER_REGISTRY", "Problem", "check_kustomization"]
