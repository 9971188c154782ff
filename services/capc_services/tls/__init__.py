"""Federation PKI and mutual-TLS credentials."""

from capc_services.tls.credentials import GRPC_OPTIONS, SERVER_OPTIONS, TlsFiles
from capc_services.tls.csr import CertificateRequest, SignedCertificate, request_certificate, sign_request
from capc_services.tls.names import check_certificate_names, refusal
from capc_services.tls.pki import (
    CertificateInfo,
    IssuedCertificate,
    bootstrap,
    certificate_info,
    describe_certificate,
    init_ca,
    issue_certificate,
    write_admin_token,
)

__all__ = [
    "GRPC_OPTIONS",
    "SERVER_OPTIONS",
    "CertificateInfo",
    "CertificateRequest",
    "IssuedCertificate",
    "SignedCertificate",
    "TlsFiles",
    "bootstrap",
    "certificate_info",
    "check_certificate_names",
    "describe_certificate",
    "init_ca",
    "issue_certificate",
    "refusal",
    "request_certificate",
    "sign_request",
    "write_admin_token",
]
