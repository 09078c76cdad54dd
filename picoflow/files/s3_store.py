"""The S3 file store: a private bucket, uploads through presigned PUT URLs, reads through boto3.

Every request goes through boto3's public client API with short timeouts and botocore's standard retry mode
(bounded attempts), so tracing, ``Stubber`` and moto see each one.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote, unquote

from picoflow.errors import FileStoreError
from picoflow.files.refs import is_file_id
from picoflow.files.store import FileRecord, FileStore, UploadTicket, owner_tag

#: Where uploads go in the bucket; the template's lifecycle rule expires this prefix.
UPLOAD_PREFIX = "uploads/"
S3_TIMEOUTS: dict[str, Any] = {
    "connect_timeout": 2,
    "read_timeout": 10,
    "retries": {"mode": "standard", "total_max_attempts": 3},
}
_MISSING = frozenset({"404", "NoSuchKey", "NotFound"})
#: S3 refuses an object whose user metadata (the UTF-8 bytes of every key and value) exceeds 2 KB.
S3_METADATA_BYTES = 2048
#: How each metadata key travels, as a header; counting it whole keeps the estimate on the safe side.
_META_HEADER = "x-amz-meta-"


class S3FileStore(FileStore):
    """Files in ``bucket`` under ``uploads/<id>``; the record (declared size included) travels as the object's
    signed metadata, so the size is checked against the bytes again when the file is used.

    ``client`` (a boto3 S3 client) is built on first use when not given, with ``config`` (a botocore
    ``Config``; by default ``S3_TIMEOUTS`` and SigV4), ``region_name`` and ``endpoint_url``.
    """

    def __init__(
        self,
        bucket: str,
        *,
        client: Any = None,
        config: Any = None,
        region_name: str | None = None,
        endpoint_url: str | None = None,
    ) -> None:
        self.bucket = bucket
        self._client = client
        self._config = config
        self._region_name = region_name
        self._endpoint_url = endpoint_url

    def _get_client(self) -> Any:
        if self._client is None:
            import boto3
            from botocore.config import Config

            config = self._config or Config(signature_version="s3v4", **S3_TIMEOUTS)
            self._client = boto3.client(
                "s3", config=config, region_name=self._region_name, endpoint_url=self._endpoint_url
            )
        return self._client

    async def presign_upload(self, record: FileRecord, expires_in: int) -> UploadTicket:
        metadata = _metadata(record)
        params = {
            "Bucket": self.bucket,
            "Key": UPLOAD_PREFIX + record.id,
            "ContentType": record.content_type,
            "ContentLength": record.size,
            "Metadata": metadata,
        }
        # Presigning is local work (no request): type, length and metadata are signed, so S3 refuses any other.
        url = self._get_client().generate_presigned_url("put_object", Params=params, ExpiresIn=expires_in)
        headers = {"Content-Type": record.content_type, **{f"x-amz-meta-{k}": v for k, v in metadata.items()}}
        return UploadTicket(file_id=record.id, upload_url=url, upload_headers=headers, expires_in=expires_in)

    async def describe(self, file_id: str) -> FileRecord | None:
        if not is_file_id(file_id):
            return None
        head = await self._call("head_object", Bucket=self.bucket, Key=UPLOAD_PREFIX + file_id)
        if head is None:
            return None
        meta = head.get("Metadata") or {}
        try:
            return FileRecord(
                id=file_id,
                name=unquote(meta.get("name", "")),
                content_type=str(head.get("ContentType") or "").split(";")[0].strip().lower(),
                size=int(meta.get("size", "-1")),
                owner=meta.get("owner", ""),
                session=meta.get("session", ""),
                expires_at=int(meta.get("expires", "0")),
            )
        except ValueError:
            return None

    async def read(self, file_id: str, limit: int) -> bytes | None:
        if not is_file_id(file_id):
            return None
        # A ranged GET: an object larger than expected costs no more than limit + 1 bytes.
        answer = await self._call(
            "get_object", Bucket=self.bucket, Key=UPLOAD_PREFIX + file_id, Range=f"bytes=0-{limit}"
        )
        if answer is None:
            return None
        body = answer["Body"]
        try:
            return await asyncio.to_thread(body.read)
        finally:
            body.close()

    async def put(self, record: FileRecord, data: bytes) -> None:
        await self._call(
            "put_object", Bucket=self.bucket, Key=UPLOAD_PREFIX + record.id, Body=data,
            ContentType=record.content_type, Metadata=_metadata(record),
        )

    async def delete_owner(self, owner: str) -> int:
        """Delete the owner's uploads. S3 cannot look objects up by metadata, so this lists ``uploads/`` and reads
        each object's record: the bucket's lifecycle rule keeps that to the files of the last few days."""
        if not owner:
            raise ValueError("delete_owner needs a principal; anonymous uploads belong to nobody.")
        tag = owner_tag(owner)
        removed = 0
        request: dict[str, Any] = {"Bucket": self.bucket, "Prefix": UPLOAD_PREFIX}
        while True:
            page = await self._call("list_objects_v2", **request) or {}
            for listed in page.get("Contents", []):
                file_id = str(listed["Key"]).removeprefix(UPLOAD_PREFIX)
                record = await self.describe(file_id)
                if record is not None and record.owner == tag:
                    await self._call("delete_object", Bucket=self.bucket, Key=UPLOAD_PREFIX + file_id)
                    removed += 1
            if not page.get("IsTruncated"):
                return removed
            request["ContinuationToken"] = page["NextContinuationToken"]

    async def _call(self, method: str, **request: Any) -> dict[str, Any] | None:
        from botocore.exceptions import BotoCoreError, ClientError

        send = getattr(self._get_client(), method)
        try:
            return await asyncio.to_thread(lambda: send(**request))
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in _MISSING or code == "InvalidRange":
                return None
            raise FileStoreError(f"S3 {method} failed: {code or 'ClientError'}") from exc
        except BotoCoreError as exc:
            raise FileStoreError(f"S3 {method} failed: {type(exc).__name__}") from exc


def metadata_bytes(metadata: dict[str, str]) -> int:
    """What ``metadata`` counts against S3's limit: the UTF-8 bytes of every key (as its header) and value."""
    return sum(len(f"{_META_HEADER}{key}{value}".encode()) for key, value in metadata.items())


def _metadata(record: FileRecord) -> dict[str, str]:
    fields = {
        "owner": record.owner,
        "session": record.session,
        "expires": str(record.expires_at),
        "size": str(record.size),
    }
    # The name gets what the other fields leave of the limit (the whole metadata counts).
    room = S3_METADATA_BYTES - metadata_bytes({**fields, "name": ""})
    return {"name": _encoded_name(record.name, room), **fields}


def _encoded_name(name: str, room: int) -> str:
    """``name`` percent-encoded (S3 metadata is ASCII), cut between characters to at most ``room`` bytes."""
    encoded = [quote(character, safe="") for character in name]
    used = 0
    for count, part in enumerate(encoded):
        used += len(part)
        if used > room:
            return "".join(encoded[:count])
    return "".join(encoded)

