"""Federation PKI and mutual-TLS credentials."""

from capc_services.tls.credentials import GRPC_OPTIONS, SERVER_OPTIONS, TlsFiles
from capc_services.tls.pki import (
    CertificateInfo,
    IssuedCertificate,
    bootstrap,
    certificate_info,
    init_ca,
    issue_certificate,
    write_admin_token,
)

__all__ = [
    "GRPC_OPTIONS",
    "SERVER_OPTIONS",
    "CertificateInfo",
    "IssuedCertificate",
    "TlsFiles",
    "bootstrap",
    "certificate_info",
    "init_ca",
    "issue_certificate",
    "write_admin_token",
]
