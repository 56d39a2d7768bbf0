"""Local stand-ins for the Vertex AI, Cloud Storage and Kubeflow Pipelines REST APIs, on loopback.

Cloud Storage serves bucket metadata, and with `buckets={name: local folder}` the objects of those
buckets (listing, metadata, ranged media downloads) to google-cloud-storage and Beam's gs://
file system, which talk to it when STORAGE_EMULATOR_HOST is this service's url.

The real client libraries (google-cloud-aiplatform, kfp) talk to these; each
request is recorded so tests can assert what would reach the service. Nothing
here is a mock of this project's code.
"""

import json
import os
import re
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, List, Optional, Tuple
from urllib.parse import parse_qs, unquote, urlparse

from google.auth.credentials import AnonymousCredentials

PROJECT_NUMBER = "123456789012"


class FakeService:
    def __init__(
        self,
        existing_schedules=(),
        buckets: Optional[Dict[str, str]] = None,
        service_account: str = "123-compute@developer.gserviceaccount.com",
    ):
        self.requests: List[Dict] = []
        self.service_account = service_account  # what the GCE metadata server says this machine runs as
        self.jobs: Dict[str, Dict] = {}  # created pipeline jobs, by resource name
        self.existing_schedules = list(existing_schedules)  # display names the services already have
        self.buckets = dict(buckets or {})  # Cloud Storage bucket name -> the local folder it serves
        handler = self._handler()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def host_port(self) -> str:
        return f"127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._server.shutdown()
        self._server.server_close()

    def serve_resource_manager(self, monkeypatch):
        """Points aiplatform's Resource Manager client here (it takes no endpoint option; unanswered,
        its retries to the real service take about a minute offline)."""
        from google.cloud.aiplatform.utils import resource_manager_utils

        real = resource_manager_utils.resourcemanager.ProjectsClient
        monkeypatch.setattr(
            resource_manager_utils.resourcemanager,
            "ProjectsClient",
            lambda credentials=None: real(
                credentials=AnonymousCredentials(), transport="rest", client_options={"api_endpoint": self.url}
            ),
        )

    def credentials_file(self, folder: str) -> str:
        """Application Default Credentials (GOOGLE_APPLICATION_CREDENTIALS): a service account with a key made
        here, whose tokens come from this service. Without any, Beam's gs:// file system retries its
        credential lookup with backoff for ~30 s a process before it connects anonymously; a machine that
        uses Cloud Storage has credentials. (google-auth ignores an authorized_user file's token_uri.)"""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        path = os.path.join(folder, "fake-adc.json")
        with open(path, "w") as f:
            json.dump(
                {
                    "type": "service_account",
                    "project_id": "proj-1",
                    "private_key_id": "fake-key",
                    "private_key": key.decode(),
                    "client_email": "tests@proj-1.iam.gserviceaccount.com",
                    "client_id": "1",
                    "token_uri": f"{self.url}/token",
                },
                f,
            )
        return path

    def find(self, method: str, path_pattern: str) -> List[Dict]:
        return [r for r in self.requests if r["method"] == method and re.search(path_pattern, r["path"])]

    def _object(self, bucket: str, name: str) -> Dict:
        st = os.stat(os.path.join(self.buckets[bucket], name))
        return {
            "kind": "storage#object",
            "bucket": bucket,
            "name": name,
            "size": str(st.st_size),
            "generation": "1",
            "metageneration": "1",
            "contentType": "application/octet-stream",
            "updated": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(st.st_mtime)),
        }

    def storage(self, path: str, query: Dict, headers) -> Optional[Tuple[int, object, Dict[str, str]]]:
        """Cloud Storage's JSON API for the served buckets: (status, JSON or bytes, headers), or None."""
        m = re.fullmatch(r"/storage/v1/b/([^/]+)/o", path)
        if m and m.group(1) in self.buckets:
            bucket, prefix = m.group(1), (query.get("prefix") or [""])[0]
            folder = self.buckets[bucket]
            names = sorted(
                os.path.relpath(os.path.join(d, f), folder).replace(os.sep, "/")
                for d, _, files in os.walk(folder)
                for f in files
            )
            return (
                200,
                {"kind": "storage#objects", "items": [self._object(bucket, n) for n in names if n.startswith(prefix)]},
                {},
            )
        m = re.fullmatch(r"/(download/)?storage/v1/b/([^/]+)/o/(.+)", path)
        if not m or m.group(2) not in self.buckets:
            return None
        bucket, name = m.group(2), unquote(m.group(3))
        local = os.path.join(self.buckets[bucket], name)
        if not os.path.isfile(local):
            return 404, {"error": {"code": 404, "message": f"No such object: {bucket}/{name}"}}, {}
        if (query.get("alt") or [""])[0] != "media":
            return 200, self._object(bucket, name), {}
        with open(local, "rb") as f:
            data = f.read()
        ranged = re.fullmatch(r"bytes=(\d+)-(\d*)", headers.get("Range") or "")
        if not ranged:
            return 200, data, {}
        start = int(ranged.group(1))
        end = int(ranged.group(2)) if ranged.group(2) else len(data) - 1
        part = data[start : end + 1]
        return 206, part, {"Content-Range": f"bytes {start}-{start + len(part) - 1}/{len(data)}"}

    def respond(self, method: str, path: str, query: Dict, body) -> tuple:
        """(status, JSON response) for a request; the routes of the three APIs."""
        # Vertex AI (REST): pipeline jobs and schedules.
        m = re.fullmatch(r"/v1/(projects/[^/]+/locations/[^/]+)/pipelineJobs", path)
        if m and method == "POST":
            job_id = (query.get("pipelineJobId") or [uuid.uuid4().hex[:8]])[0]
            job = {**body, "name": f"{m.group(1)}/pipelineJobs/{job_id}", "state": "PIPELINE_STATE_PENDING"}
            self.jobs[job["name"]] = job
            return 200, job
        m = re.fullmatch(r"/v1/(projects/[^/]+/locations/[^/]+/pipelineJobs/[^/]+)", path)
        if m and method == "GET" and m.group(1) in self.jobs:  # the TFX CLI prints a created run's state
            return 200, self.jobs[m.group(1)]
        m = re.fullmatch(r"/v1/(projects/[^/]+/locations/[^/]+)/schedules", path)
        if m and method == "POST":
            return 200, {**body, "name": f"{m.group(1)}/schedules/123", "state": "ACTIVE"}
        if m and method == "GET":
            wanted = re.search(r'display_name="([^"]*)"', (query.get("filter") or [""])[0])
            return 200, {
                "schedules": [
                    {"name": f"{m.group(1)}/schedules/9", "displayName": name}
                    for name in self.existing_schedules
                    if wanted and name == wanted.group(1)
                ]
            }
        # Cloud Storage (STORAGE_EMULATOR_HOST): the pipeline root's bucket exists, in the caller's project.
        m = re.fullmatch(r"/storage/v1/b/([^/]+)", path)
        if m and method == "GET":
            return 200, {"name": m.group(1), "location": "US-CENTRAL1", "projectNumber": PROJECT_NUMBER}
        # Resource Manager: aiplatform looks up the project's number to check who owns that bucket.
        m = re.fullmatch(r"/v3/projects/([^/]+)", path)
        if m and method == "GET":
            return 200, {"name": f"projects/{PROJECT_NUMBER}", "projectId": m.group(1)}
        # The GCE metadata server (GCE_METADATA_HOST): the account a task on Vertex runs as.
        if path == "/computeMetadata/v1/instance/service-accounts/default/email" and method == "GET":
            return 200, self.service_account.encode()
        # OAuth 2.0 token endpoint of credentials_file()'s credentials.
        if path == "/token" and method == "POST":
            return 200, {"access_token": "fake-access-token", "token_type": "Bearer", "expires_in": 3600}
        # Kubeflow Pipelines v2beta1.
        if path == "/apis/v2beta1/healthz":
            return 200, {"multi_user": False}
        if path == "/apis/v2beta1/experiments" and method == "POST":
            return 200, {**body, "experiment_id": "exp-1"}
        if path == "/apis/v2beta1/experiments" and method == "GET":
            return 200, {"experiments": [], "total_size": 0}
        if path == "/apis/v2beta1/runs" and method == "POST":
            return 200, {**body, "run_id": "run-1", "state": "PENDING"}
        if path == "/apis/v2beta1/recurringruns" and method == "POST":
            return 200, {**body, "recurring_run_id": "recurring-1", "status": "ENABLED"}
        if path == "/apis/v2beta1/recurringruns" and method == "GET":  # the API names the list recurringRuns
            return 200, {
                "recurringRuns": [
                    {"recurring_run_id": "old-1", "display_name": name} for name in self.existing_schedules
                ],
                "total_size": 0,
            }
        return 404, {"error": f"no fake route for {method} {path}"}

    def _handler(self):
        service = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self, method):
                parsed = urlparse(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else {}
                except ValueError:
                    body = {"raw": raw.decode("latin-1")}
                query = parse_qs(parsed.query)
                service.requests.append({"method": method, "path": parsed.path, "query": query, "body": body})
                stored = service.storage(parsed.path, query, self.headers) if method == "GET" else None
                status, response, headers = stored or (*service.respond(method, parsed.path, query, body), {})
                raw = isinstance(response, bytes)
                data = response if raw else json.dumps(response).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/octet-stream" if raw else "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._serve("GET")

            def do_POST(self):
                self._serve("POST")

            def log_message(self, *args):  # keep test output clean
                pass

        return Handler
