"""LOCAL HUB STAND-IN for tests: NOT the Hugging Face Hub.

A small in-memory HTTP server that implements only the Hub endpoints the real `huggingface_hub`
client (2.x) calls for the paths we test, so `create_repo`, `upload_folder`, `hf_hub_download`,
`snapshot_download`, `from_pretrained("org/name")` and `ModelCard.load` run unmodified against it:

    POST /api/repos/create                                create_repo
    POST /api/models/{repo}/branch/{branch}               create_branch (push --revision)
    POST /api/models/{repo}/preupload/{rev}               upload modes: always "regular" (base64 in the
                                                          commit), so neither LFS nor Xet storage is needed
    POST /api/models/{repo}/commit/{rev}                  ndjson commit (header, file, deletedFile)
    GET  /api/models/{repo}[/revision/{rev}]              model_info / repo_info (sha + siblings)
    GET  /api/models/{repo}/tree/{rev}[/{path}]           list_repo_tree (snapshot_download, chat templates)
    HEAD/GET /{repo}/resolve/{rev}/{filename}             file metadata + download
    POST /api/validate-yaml                               README.md metadata check before upload
    GET  /api/whoami-v2                                   token check
    GET  /api/agent-harnesses                             the client's user-agent registry: served empty

Errors carry the `X-Error-Code` header the client maps to its exception types (RepoNotFound,
RevisionNotFound, EntryNotFound). Write endpoints need `Authorization: Bearer <token>`; private repos
also need it to read. Every request is logged in `requests`; any route it does not implement answers 404
and is recorded in `unhandled`, so a test can assert the client used nothing outside this list.
It binds 127.0.0.1 only.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

STANDIN_TOKEN = "hf_standin_write_token"
_REPO = r"(?P<repo>[\w.-]+/[\w.-]+)"
_ZERO_SHA = "0" * 40


def git_blob_oid(content: bytes) -> str:
    """The git blob id the Hub reports as a regular file's oid / ETag."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


@dataclass
class _Repo:
    private: bool
    # commit sha -> {path: content}; branch name -> head commit sha
    commits: dict[str, dict[str, bytes]] = field(default_factory=lambda: {_ZERO_SHA: {}})
    branches: dict[str, str] = field(default_factory=lambda: {"main": _ZERO_SHA})
    messages: list[str] = field(default_factory=list)

    def resolve(self, revision: str) -> str | None:
        if revision in self.branches:
            return self.branches[revision]
        return revision if revision in self.commits else None


class HubStandIn:
    """In-memory Hub stand-in on `http://127.0.0.1:<free port>`; use as a context manager."""

    def __init__(self, tokens: tuple[str, ...] = (STANDIN_TOKEN,)) -> None:
        self.tokens = set(tokens)
        self.repos: dict[str, _Repo] = {}
        self.requests: list[tuple[str, str]] = []
        self.unhandled: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, name="hub-standin", daemon=True
        )
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> HubStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def files(self, repo_id: str, revision: str = "main") -> dict[str, bytes]:
        repo = self.repos[repo_id]
        return dict(repo.commits[repo.resolve(revision)])


class _Handler(BaseHTTPRequestHandler):
    hub: HubStandIn  # set per server by `_handler_for`
    protocol_version = "HTTP/1.1"
    server_version = "HubStandIn/0.1"

    def log_message(self, format: str, *args: Any) -> None:  # keep pytest output quiet
        pass

    # --- plumbing -------------------------------------------------------------------------
    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while size := int(self.rfile.readline().strip(), 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            self.rfile.readline()
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _send(
        self, status: int, body: bytes = b"", headers: dict[str, str] | None = None, head: bool = False
    ) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _json(self, status: int, payload: Any) -> None:
        self._send(status, json.dumps(payload).encode(), {"Content-Type": "application/json"})

    def _error(self, status: int, code: str | None, message: str, head: bool = False) -> None:
        headers = {"Content-Type": "application/json", "X-Error-Message": message}
        if code:
            headers["X-Error-Code"] = code
        self._send(status, json.dumps({"error": message}).encode(), headers, head=head)

    def _authorized(self) -> bool:
        auth = self.headers.get("Authorization", "")
        return auth.startswith("Bearer ") and auth.removeprefix("Bearer ") in self.hub.tokens

    def _repo(self, repo_id: str, head: bool = False) -> _Repo | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None or (repo.private and not self._authorized()):
            self._error(404 if repo is None else 401, "RepoNotFound", "Repository not found", head=head)
            return None
        return repo

    def _route(self, method: str) -> None:
        split = urlsplit(self.path)
        path, query = split.path, parse_qs(split.query)
        self.hub.requests.append((method, unquote(path)))
        for verb, pattern, action in self.ROUTES:
            match = re.fullmatch(pattern, path)
            if verb == method and match:
                groups = {k: unquote(v) for k, v in match.groupdict().items() if v is not None}
                with self.hub._lock:
                    return action(self, query=query, **groups)
        self.hub.unhandled.append((method, unquote(path)))
        self._error(404, None, f"hub stand-in: {method} {path} is not implemented", head=method == "HEAD")

    def do_GET(self) -> None:
        self._route("GET")

    def do_HEAD(self) -> None:
        self._route("HEAD")

    def do_POST(self) -> None:
        self._route("POST")

    # --- endpoints ------------------------------------------------------------------------
    def whoami(self, query: dict) -> None:
        if not self._authorized():
            return self._error(401, None, "Invalid credentials in Authorization header")
        self._json(200, {"type": "user", "name": "standin-user", "orgs": []})

    def validate_yaml(self, query: dict) -> None:
        content = json.loads(self._body())["content"]
        match = re.match(r"^---\n(.*?)\n---\n", content, flags=re.S)
        try:
            metadata = yaml.safe_load(match.group(1)) if match else {}
        except yaml.YAMLError as err:
            return self._json(400, {"errors": [{"message": f"invalid YAML: {err}"}], "warnings": []})
        if not isinstance(metadata, dict):
            return self._json(400, {"errors": [{"message": "metadata must be a mapping"}], "warnings": []})
        self._json(200, {"errors": [], "warnings": []})

    def agent_harnesses(self, query: dict) -> None:
        self._json(200, {"standardEnvVars": [], "harnesses": {}})

    def create_repo(self, query: dict) -> None:
        body = json.loads(self._body() or b"{}")
        if not self._authorized():
            return self._error(401, None, "Invalid credentials in Authorization header")
        if body.get("type", "model") not in (None, "model"):
            return self._error(400, None, "hub stand-in: only model repos are implemented")
        repo_id = f"{body['organization']}/{body['name']}" if body.get("organization") else body["name"]
        if "/" not in repo_id:
            repo_id = f"standin-user/{repo_id}"
        url = f"{self.hub.url}/{repo_id}"
        if repo_id in self.hub.repos:
            return self._json(409, {"error": "You already created this model repo", "url": url})
        self.hub.repos[repo_id] = _Repo(
            private=body.get("visibility") == "private" or bool(body.get("private"))
        )
        self._json(200, {"url": url, "name": repo_id, "id": repo_id})

    def create_branch(self, query: dict, repo: str, branch: str) -> None:
        body = json.loads(self._body() or b"{}")
        if not self._authorized():
            return self._error(401, None, "Invalid credentials in Authorization header")
        if (state := self._repo(repo)) is None:
            return
        if branch in state.branches:
            return self._error(409, None, f"Reference already exists: {branch}")
        start = state.resolve(body.get("startingPoint") or "main")
        if start is None:
            return self._error(404, "RevisionNotFound", "Invalid starting point")
        state.branches[branch] = start
        self._json(200, {})

    def preupload(self, query: dict, repo: str, rev: str) -> None:
        body = json.loads(self._body())
        if not self._authorized():
            return self._error(401, None, "Invalid credentials in Authorization header")
        if (state := self._repo(repo)) is None:
            return
        if (sha := state.resolve(rev)) is None:
            return self._error(404, "RevisionNotFound", f"Revision not found: {rev}")
        current = state.commits[sha]
        files = [
            {
                "path": item["path"],
                "uploadMode": "regular",
                "shouldIgnore": False,
                "oid": git_blob_oid(current[item["path"]]) if item["path"] in current else None,
            }
            for item in body["files"]
        ]
        self._json(200, {"files": files, "commitOid": sha})

    def commit(self, query: dict, repo: str, rev: str) -> None:
        lines = [json.loads(line) for line in self._body().splitlines() if line.strip()]
        if not self._authorized():
            return self._error(401, None, "Invalid credentials in Authorization header")
        if (state := self._repo(repo)) is None:
            return
        if rev not in state.branches:
            return self._error(404, "RevisionNotFound", f"Branch not found: {rev}")
        files = dict(state.commits[state.branches[rev]])
        summary = ""
        for line in lines:
            key, value = line["key"], line["value"]
            if key == "header":
                summary = value.get("summary", "")
            elif key == "file":
                files[value["path"]] = base64.b64decode(value["content"])
            elif key == "deletedFile":
                files.pop(value["path"], None)
            elif key == "deletedFolder":
                files = {p: c for p, c in files.items() if not p.startswith(value["path"].rstrip("/") + "/")}
            else:  # lfsFile etc.: the stand-in never asks for LFS in preupload
                return self._error(400, None, f"hub stand-in: commit operation {key!r} is not implemented")
        parent = state.branches[rev]
        digest = hashlib.sha1(parent.encode() + summary.encode())
        for path in sorted(files):
            digest.update(path.encode() + b"\0" + git_blob_oid(files[path]).encode())
        sha = digest.hexdigest()
        state.commits[sha] = files
        state.branches[rev] = sha
        state.messages.append(summary)
        self._json(
            200,
            {"commitUrl": f"{self.hub.url}/{repo}/commit/{sha}", "commitOid": sha, "pullRequestUrl": None},
        )

    def model_info(self, query: dict, repo: str, rev: str = "main") -> None:
        if (state := self._repo(repo)) is None:
            return
        if (sha := state.resolve(rev)) is None:
            return self._error(404, "RevisionNotFound", f"Revision not found: {rev}")
        files = state.commits[sha]
        siblings = [
            {"rfilename": p, "size": len(c), "blobId": git_blob_oid(c)} for p, c in sorted(files.items())
        ]
        self._json(
            200, {"id": repo, "modelId": repo, "sha": sha, "private": state.private, "siblings": siblings}
        )

    def tree(self, query: dict, repo: str, rev: str, path: str | None = None) -> None:
        if (state := self._repo(repo)) is None:
            return
        if (sha := state.resolve(rev)) is None:
            return self._error(404, "RevisionNotFound", f"Revision not found: {rev}")
        prefix = f"{path.strip('/')}/" if path else ""
        files = {p: c for p, c in state.commits[sha].items() if p.startswith(prefix)}
        if prefix and not files:
            return self._error(404, "EntryNotFound", f"Entry not found: {path}")
        recursive = query.get("recursive", ["false"])[0].lower() == "true"
        entries, folders = [], set()
        for p, content in sorted(files.items()):
            rest = p[len(prefix) :]
            if "/" in rest and not recursive:
                folders.add(prefix + rest.split("/")[0])
                continue
            entries.append({"type": "file", "path": p, "size": len(content), "oid": git_blob_oid(content)})
        entries += [{"type": "directory", "path": f, "oid": _ZERO_SHA} for f in sorted(folders)]
        self._json(200, entries)

    def resolve(self, query: dict, repo: str, rev: str, filename: str, head: bool = False) -> None:
        if (state := self._repo(repo, head=head)) is None:
            return
        if (sha := state.resolve(rev)) is None:
            return self._error(404, "RevisionNotFound", f"Revision not found: {rev}", head=head)
        content = state.commits[sha].get(filename)
        if content is None:
            return self._error(404, "EntryNotFound", f"Entry not found: {filename}", head=head)
        headers = {"X-Repo-Commit": sha, "ETag": f'"{git_blob_oid(content)}"'}
        self._send(200, content, {"Content-Type": "application/octet-stream", **headers}, head=head)

    def resolve_head(self, query: dict, repo: str, rev: str, filename: str) -> None:
        self.resolve(query, repo, rev, filename, head=True)

    # (method, pattern over the still-quoted path, handler); revisions arrive URL-quoted ("refs%2Fpr%2F1")
    ROUTES = (
        ("GET", r"/api/whoami-v2", whoami),
        ("GET", r"/api/agent-harnesses", agent_harnesses),
        ("POST", r"/api/repos/create", create_repo),
        ("POST", r"/api/validate-yaml", validate_yaml),
        ("POST", rf"/api/models/{_REPO}/branch/(?P<branch>[^/]+)", create_branch),
        ("POST", rf"/api/models/{_REPO}/preupload/(?P<rev>[^/]+)", preupload),
        ("POST", rf"/api/models/{_REPO}/commit/(?P<rev>[^/]+)", commit),
        ("GET", rf"/api/models/{_REPO}", model_info),
        ("GET", rf"/api/models/{_REPO}/revision/(?P<rev>[^/]+)", model_info),
        ("GET", rf"/api/models/{_REPO}/tree/(?P<rev>[^/]+)(?:/(?P<path>.+))?", tree),
        ("HEAD", rf"/{_REPO}/resolve/(?P<rev>[^/]+)/(?P<filename>.+)", resolve_head),
        ("GET", rf"/{_REPO}/resolve/(?P<rev>[^/]+)/(?P<filename>.+)", resolve),
    )


def _handler_for(hub: HubStandIn) -> type[BaseHTTPRequestHandler]:
    return type("HubStandInHandler", (_Handler,), {"hub": hub})
