"""How S3 and botocore errors become this package's: one table, code by code.

A missing object is ``FileNotFoundError``; a refusal :class:`S3PermissionError`;
anything else a :class:`StorageError` naming the bucket and the endpoint. Messages
never quote credentials (some codes' S3 messages are not repeated at all).
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from botocore.exceptions import (
    ClientError,
    ConnectTimeoutError,
    CredentialRetrievalError,
    EndpointConnectionError,
    NoCredentialsError,
    PartialCredentialsError,
)

from ..errors import StorageError

__all__ = [
    "ERRORS",
    "NOT_FOUND",
    "NO_BUCKET",
    "OTHER",
    "S3PermissionError",
    "detail_of",
    "error_code",
    "safe_url",
]


class S3PermissionError(StorageError, PermissionError):
    """S3 refused the request (AccessDenied, AllAccessDisabled, HTTP 403)."""


# --------------------------------------------------------------------------- errors


@dataclass(frozen=True)
class _Rule:
    exc: type[OSError]
    errno: int
    #: Formatted with target (s3:// URL), bucket, endpoint, code and detail.
    message: str


NOT_FOUND = _Rule(FileNotFoundError, errno.ENOENT, "No such object")
NO_BUCKET = _Rule(
    StorageError,
    errno.ENOENT,
    "S3 bucket {bucket!r} does not exist at endpoint {endpoint} (needed for {target})",
)
_DENIED = _Rule(
    S3PermissionError,
    errno.EACCES,
    "{target}: access denied ({code}) at endpoint {endpoint}: the AWS "
    "credentials in use lack permission on bucket {bucket!r}",
)
_REJECTED = _Rule(
    StorageError,
    errno.EACCES,
    "the AWS credentials were rejected ({code}) by endpoint {endpoint} "
    "for bucket {bucket!r} ({target}); check the standard AWS credential "
    "chain: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/AWS_SESSION_TOKEN, "
    "AWS_PROFILE and ~/.aws, SSO, container or instance role",
)
_NO_CREDENTIALS = _Rule(
    StorageError,
    errno.EACCES,
    "no AWS credentials were found in the standard chain "
    "(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE and "
    "~/.aws, SSO, container or instance role) to access bucket "
    "{bucket!r} at endpoint {endpoint} ({target}){detail}",
)
_UNREACHABLE = _Rule(
    StorageError,
    errno.EHOSTUNREACH,
    "S3 endpoint {endpoint} is unreachable for bucket {bucket!r} "
    "({target}): {detail}; check PIPELINE_S3_ENDPOINT_URL or "
    "AWS_ENDPOINT_URL and the network",
)
OTHER = _Rule(
    StorageError, errno.EIO, "{target}: S3 request to endpoint {endpoint} failed: {detail}"
)

#: The one table from S3 error codes (and pseudo-codes for botocore's own
#: exceptions, see :func:`error_code`) to the exceptions callers see.
ERRORS: dict[str, _Rule] = {
    "NoSuchBucket": NO_BUCKET,
    "NoSuchKey": NOT_FOUND,
    "NotFound": NOT_FOUND,
    "404": NOT_FOUND,  # HEAD responses carry no error body
    "AccessDenied": _DENIED,
    "AllAccessDisabled": _DENIED,
    "403": _Rule(
        S3PermissionError,
        errno.EACCES,
        "{target}: access denied (HTTP 403) at endpoint {endpoint}: the AWS "
        "credentials were rejected or lack permission on bucket {bucket!r}",
    ),
    "InvalidAccessKeyId": _REJECTED,
    "SignatureDoesNotMatch": _REJECTED,
    "ExpiredToken": _REJECTED,
    "InvalidToken": _REJECTED,
    "TokenRefreshRequired": _REJECTED,
    "PreconditionFailed": _Rule(
        StorageError, errno.EIO, "{target} was replaced while it was being read"
    ),
    "InvalidBucketName": _Rule(
        StorageError,
        errno.EINVAL,
        "{bucket!r} is not a valid bucket name at endpoint {endpoint} ({target})",
    ),
    # botocore exceptions without an S3 error code
    "-unreachable": _UNREACHABLE,
    "-no-credentials": _NO_CREDENTIALS,
}

# Codes whose S3 message is not repeated (an S3 message can quote the request).
_QUIET_CODES = {
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "TokenRefreshRequired",
}


def error_code(exc: BaseException) -> str:
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return str(err.get("Code") or status or "")
    if isinstance(exc, (EndpointConnectionError, ConnectTimeoutError)):
        return "-unreachable"
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError, CredentialRetrievalError)):
        return "-no-credentials"
    return ""


def detail_of(exc: BaseException, code: str) -> str:
    if isinstance(exc, ClientError):
        if code in _QUIET_CODES:
            return code
        message = exc.response.get("Error", {}).get("Message") or ""
        return f"{code}: {message}" if message else code
    if isinstance(exc, CredentialRetrievalError):
        # Only the provider: its message may quote a credential_process's output.
        return f"; retrieving them from {exc.kwargs.get('provider', 'a provider')} failed"
    if isinstance(exc, PartialCredentialsError):
        return f"; only part of them were set ({exc.kwargs.get('cred_var', '?')} missing)"
    if isinstance(exc, NoCredentialsError):
        return ""
    return f"{type(exc).__name__}: {exc}"


def safe_url(url: str) -> str:
    """``url`` without user info, query or fragment."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
