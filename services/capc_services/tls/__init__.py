"""Federation PKI and mutual-TLS credentials."""

from capc_services.tls.credentials import (
    DEFAULT_MESSAGE_BYTES,
    TlsFiles,
    channel_ready,
    grpc_options,
    peer_problem,
)
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
from capc_services.tls.proof import ServerCheck, ServerIdentity

__all__ = [
    "DEFAULT_MESSAGE_BYTES",
    "CertificateInfo",
    "CertificateRequest",
    "IssuedCertificate",
    "ServerCheck",
    "ServerIdentity",
    "SignedCertificate",
    "TlsFiles",
    "bootstrap",
    "certificate_info",
    "channel_ready",
    "check_certificate_names",
    "describe_certificate",
    "grpc_options",
    "init_ca",
    "issue_certificate",
    "peer_problem",
    "refusal",
    "request_certificate",
    "sign_request",
    "write_admin_token",
]
