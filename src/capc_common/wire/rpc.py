"""gRPC stubs and servicer bases of the ``capc.v1`` services, under stable names.

The generated ``*_pb2_grpc`` modules are untyped; they are loaded by name here (the one place that touches
them) so the type checker sees ``Any`` instead of walking generated code.
"""

from __future__ import annotations

import importlib
from typing import Any

_guardian = importlib.import_module("capc_common.wire.capc.v1.guardian_pb2_grpc")
_student = importlib.import_module("capc_common.wire.capc.v1.student_pb2_grpc")

GUARDIAN_SERVICE = "capc.v1.GuardianService"
STUDENT_SERVICE = "capc.v1.StudentService"

GuardianServiceServicer: Any = _guardian.GuardianServiceServicer
GuardianServiceStub: Any = _guardian.GuardianServiceStub
add_GuardianServiceServicer_to_server: Any = _guardian.add_GuardianServiceServicer_to_server
StudentServiceServicer: Any = _student.StudentServiceServicer
StudentServiceStub: Any = _student.StudentServiceStub
add_StudentServiceServicer_to_server: Any = _student.add_StudentServiceServicer_to_server

__all__ = [
    "GUARDIAN_SERVICE",
    "STUDENT_SERVICE",
    "GuardianServiceServicer",
    "GuardianServiceStub",
    "StudentServiceServicer",
    "StudentServiceStub",
    "add_GuardianServiceServicer_to_server",
    "add_StudentServiceServicer_to_server",
]
