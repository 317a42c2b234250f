"""Commit signatures, checked by git itself: `git log --format=%G?` with only the allowed keys in
view (an allowed-signers file for SSH, a private keyring for OpenPGP), never the daemon user's own
keyring or git configuration of who is trusted.

It reports what git found; which commit to act on is decided by reconciler.trust.policy.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import git

from adapters.localfiles import Refused, read_regular
from desired.models import SignaturePolicy
from desired.parse import MAX_FILE_BYTES

GPG_TIMEOUT = 30.0
ANCHOR_REF = "refs/reconciler/trusted"  # local to the daemon's clone: never fetched, pushed or rewritten by others


@dataclass(frozen=True)
class Check:
    """What git says about one commit's signature: %G? (G good and allowed, B bad, U good but not
    allowed, N none, E cannot be checked, X/Y/R expired or revoked), the key and the signer."""

    code: str
    key: str = ""
    signer: str = ""
    problem: str = ""  # the allowed keys could not be read: nothing verifies


class Signatures:
    def __init__(self, repo: git.Repo) -> None:
        self.repo = repo
        self._homes: dict[str, tempfile.TemporaryDirectory[str]] = {}  # keys' digest -> keyring

    # ---- history ------------------------------------------------------------------------------
    def changes(self, head: str, since: str | None, paths: list[str]) -> list[str]:
        """Commits after `since` up to `head` (first parent: the branch as it moved) that touched
        `paths`, oldest first."""
        span = f"{since}..{head}" if since else head
        out: str = self.repo.git.log("--first-parent", "--reverse", "--format=%H", span, "--", *paths)
        return out.split()

    def is_ancestor(self, older: str, newer: str) -> bool:
        try:
            self.repo.git.merge_base("--is-ancestor", older, newer)
        except git.GitCommandError:
            return False
        return True

    def merge_base(self, a: str, b: str) -> str | None:
        try:
            out: str = self.repo.git.merge_base(a, b)
        except git.GitCommandError:
            return None  # unrelated histories
        return out.strip() or None

    def anchor(self, subdir: str = "") -> str | None:
        """The last trusted change this clone acted on under a signature policy for the state in
        `subdir` (each folder of a monorepo has its own keys, so its own anchor), if any."""
        try:
            out: str = self.repo.git.rev_parse("--verify", "-q", f"{anchor_ref(subdir)}^{{commit}}")
        except git.GitCommandError:
            return None
        return out.strip() or None

    def set_anchor(self, commit: str, subdir: str = "") -> None:
        self.repo.git.update_ref("-m", "reconciler: last trusted change", anchor_ref(subdir), commit)

    def read(self, commit: str, path: str) -> bytes | None:
        """A policy file: from the repository at `commit`, or from this machine for an absolute path."""
        if path.startswith(("/", "~")):
            try:  # a FIFO there would block every tick; a device or a folder is no list of keys
                return read_regular(Path(path), MAX_FILE_BYTES, path)
            except (OSError, Refused):
                return None
        try:
            data: bytes = (self.repo.commit(commit).tree / path).data_stream.read()
        except KeyError:
            return None
        return data

    # ---- one commit -----------------------------------------------------------------------------
    def check(self, commit: str, policy: SignaturePolicy, at: str) -> Check:
        """Verifies `commit` against the keys `policy` names, read at commit `at` (the last trusted one)."""
        ssh = self.read(at, policy.allowed_signers) if policy.allowed_signers else b""
        gpg = self.read(at, policy.gpg_keys) if policy.gpg_keys else b""
        if ssh is None or gpg is None:
            missing = policy.allowed_signers if ssh is None else policy.gpg_keys
            return Check("E", problem=f"the allowed keys file {missing} cannot be read")
        try:
            home = self._keyring(gpg)
        except (OSError, subprocess.SubprocessError) as exc:
            return Check("E", problem=f"the OpenPGP keys in {policy.gpg_keys} cannot be imported: {exc}")
        with tempfile.NamedTemporaryFile("wb", prefix="reconciler-signers-") as signers:
            signers.write(ssh)
            signers.flush()
            status, out, err = self.repo.git.execute(
                ["git", "-c", f"gpg.ssh.allowedSignersFile={signers.name}", "-c", "gpg.ssh.revocationFile=/dev/null",
                 "log", "-1", "--format=%G?%x00%GK%x00%GS", commit],
                with_extended_output=True, with_exceptions=False, env={"GNUPGHOME": home})
        if status != 0:
            return Check("E", problem=f"git cannot check the signature: {str(err).strip()[:200]}")
        code, key, signer = (str(out).strip().split("\x00") + ["", ""])[:3]
        return Check(code or "E", key, signer)

    def _keyring(self, armored: bytes) -> str:
        """A keyring of the allowed OpenPGP keys alone, each trusted fully inside it (so that a good
        signature by one reads G); made once per distinct set of keys."""
        digest = hashlib.sha256(armored).hexdigest()
        if digest not in self._homes:
            home = tempfile.TemporaryDirectory(prefix="reconciler-gpg-")
            os.chmod(home.name, 0o700)
            env = {**os.environ, "GNUPGHOME": home.name}
            if armored.strip():
                subprocess.run(["gpg", "--batch", "--quiet", "--import"], input=armored, env=env, check=True,
                               capture_output=True, timeout=GPG_TIMEOUT)
                listing = subprocess.run(["gpg", "--batch", "--with-colons", "--list-keys"], env=env, check=True,
                                         capture_output=True, text=True, timeout=GPG_TIMEOUT).stdout
                trust = "".join(f"{line.split(':')[9]}:6:\n" for line in _primary_fingerprints(listing))
                subprocess.run(["gpg", "--batch", "--quiet", "--import-ownertrust"], input=trust.encode(), env=env,
                               check=True, capture_output=True, timeout=GPG_TIMEOUT)
            self._homes[digest] = home
        return self._homes[digest].name


def anchor_ref(subdir: str) -> str:
    """refs/reconciler/trusted for the repository root, refs/reconciler/trusted-<digest> for a folder."""
    return f"{ANCHOR_REF}-{hashlib.sha256(subdir.encode()).hexdigest()[:16]}" if subdir else ANCHOR_REF


def _primary_fingerprints(listing: str) -> list[str]:
    """The `fpr` lines that follow a `pub` line in gpg's colon listing (not the subkeys')."""
    lines = listing.splitlines()
    return [line for prev, line in zip(lines, lines[1:], strict=False)
            if prev.startswith("pub:") and line.startswith("fpr:")]
