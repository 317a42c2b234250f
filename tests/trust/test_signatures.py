"""Signed desired state (reconciler.yaml `signatures:`): real keys made here, real `git commit -S`,
real git verifying, the real loop launching local workers."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from reconciler.daemon.loop import Reconciler, TickReport
from reconciler.trust.policy import Trust, Verdict, act_on, advance, hold_note, judge
from tests.conftest import StateRepoFixture
from tests.daemon.test_loop_local import job

SIGNERS = ".reconciler/allowed_signers"
SLEEP = ["sleep", "60"]  # a worker that stays up for the test; no heartbeat needed to be launched


def need(tool: str) -> None:
    if shutil.which(tool) is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{tool} is required under CI=true (scripts/test installs it)")
        pytest.skip(f"{tool} is not installed")


def ssh_key(folder: Path, name: str) -> Path:
    key = folder / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(key)], check=True)
    return key


def ssh_commit(repo: StateRepoFixture, message: str, key: Path | None) -> str:
    repo.git("add", "-A")
    sign = ["-c", "gpg.format=ssh", "-c", f"user.signingkey={key}", "commit", "-S"] if key else ["commit"]
    repo.git(*sign, "-q", "-m", message)
    return repo.git("rev-parse", "HEAD").strip()


def launched(report: TickReport) -> set[str]:
    return {a.split()[1] for a in report.actions if a.startswith("launch ")}


@pytest.fixture
def signed_repo(state_repo: StateRepoFixture, tmp_path: Path) -> tuple[StateRepoFixture, Path, Path]:
    need("ssh-keygen")
    alice, mallory = ssh_key(tmp_path, "alice"), ssh_key(tmp_path, "mallory")
    state_repo.write(SIGNERS, f"alice@example.com {(alice.with_suffix('.pub')).read_text()}")
    settings = (state_repo.path / "reconciler.yaml").read_text()
    state_repo.write("reconciler.yaml", settings + f"signatures:\n  allowed_signers: {SIGNERS}\n")
    ssh_commit(state_repo, "require signed changes", alice)
    return state_repo, alice, mallory


def test_signed_change_acts_unsigned_and_unknown_key_are_held_then_signed_acts_again(
        signed_repo: tuple[StateRepoFixture, Path, Path], local_workdir: Path) -> None:
    repo, alice, mallory = signed_repo
    rec = Reconciler(repo.path)
    repo.write("desired/a.yaml", job("a", SLEEP))
    signed = ssh_commit(repo, "add a", alice)
    report = rec.tick()
    assert launched(report) == {"a"} and report.commit == signed
    assert report.statuses["a"].held is None

    repo.write("desired/b.yaml", job("b", SLEEP))
    unsigned = ssh_commit(repo, "add b, unsigned", None)
    report = rec.tick()
    assert "b" not in report.statuses and not launched(report)
    assert report.commit == signed  # the desired state of the last trusted change
    note = report.statuses["a"].held or ""
    assert unsigned[:12] in note and "not signed" in note
    assert unsigned[:12] in repo.status_text("a")
    assert unsigned[:12] in (repo.path / "status" / "README.md").read_text()

    repo.write("desired/c.yaml", job("c", SLEEP))
    forged = ssh_commit(repo, "add c, signed by a key not allowed", mallory)
    report = rec.tick()
    assert not {"b", "c"} & set(report.statuses) and not launched(report)
    assert forged[:12] in (report.statuses["a"].held or "") and "not allowed" in (report.statuses["a"].held or "")

    # A fresh process (a restart) walks the history again and reaches the same verdict.
    again = Reconciler(repo.path).tick()
    assert not launched(again) and forged[:12] in (again.statuses["a"].held or "")

    repo.write("desired/d.yaml", job("d", SLEEP))
    fixed = ssh_commit(repo, "add d, signed: accepts the tree it signs", alice)
    report = Reconciler(repo.path).tick()
    assert report.commit == fixed
    assert "b" in launched(report) and {"b", "c", "d"} <= set(report.statuses)  # two at a time on local
    assert all(st.held is None for st in report.statuses.values())
    assert "held" not in repo.status_text("a")


def test_unsigned_change_cannot_switch_the_checks_off_or_change_the_keys(
        signed_repo: tuple[StateRepoFixture, Path, Path], local_workdir: Path, tmp_path: Path) -> None:
    repo, alice, mallory = signed_repo
    repo.write("desired/a.yaml", job("a", SLEEP))
    ssh_commit(repo, "add a", alice)
    rec = Reconciler(repo.path)
    assert launched(rec.tick()) == {"a"}
    # Mallory adds her key to the list and signs with it: the list in force is the trusted one.
    repo.write(SIGNERS, (repo.path / SIGNERS).read_text() +
               f"mallory@example.com {(mallory.with_suffix('.pub')).read_text()}")
    repo.write("desired/m.yaml", job("m", SLEEP))
    ssh_commit(repo, "let me in", mallory)
    report = rec.tick()
    assert "m" not in report.statuses and "not allowed" in (report.statuses["a"].held or "")
    # Turning `signatures:` off without a signature is held too.
    repo.write("reconciler.yaml", (repo.path / "reconciler.yaml").read_text().split("signatures:")[0])
    off = ssh_commit(repo, "no more signatures", None)
    report = rec.tick()
    assert "m" not in report.statuses and off[:12] in (report.statuses["a"].held or "")


def test_gpg_signed_change_acts_and_unsigned_is_held(state_repo: StateRepoFixture, local_workdir: Path,
                                                     tmp_path: Path) -> None:
    need("gpg")
    home = tmp_path / "gnupg"
    home.mkdir(mode=0o700)
    env = {**os.environ, "GNUPGHOME": str(home)}
    subprocess.run(["gpg", "--batch", "--pinentry-mode", "loopback", "--passphrase", "", "--quick-gen-key",
                    "Alice <alice@example.com>", "ed25519", "sign", "never"], env=env, check=True, capture_output=True)
    armored = subprocess.run(["gpg", "--batch", "--armor", "--export", "alice@example.com"], env=env, check=True,
                             capture_output=True, text=True).stdout
    state_repo.write(".reconciler/keys.asc", armored)
    settings = (state_repo.path / "reconciler.yaml").read_text()
    state_repo.write("reconciler.yaml", settings + "signatures:\n  gpg_keys: .reconciler/keys.asc\n")

    def gpg_commit(message: str) -> str:
        state_repo.git("add", "-A")
        subprocess.run(["git", "-C", str(state_repo.path), "-c", "user.name=alice",
                        "-c", "user.email=alice@example.com", "-c", "gpg.format=openpgp",
                        "-c", "user.signingkey=alice@example.com", "commit", "-S", "-q",
                        "-m", message], env=env, check=True, capture_output=True)
        return state_repo.git("rev-parse", "HEAD").strip()

    try:
        gpg_commit("require signed changes")
        state_repo.write("desired/a.yaml", job("a", SLEEP))
        gpg_commit("add a")
        rec = Reconciler(state_repo.path)
        assert launched(rec.tick()) == {"a"}
        state_repo.write("desired/b.yaml", job("b", SLEEP))
        unsigned = state_repo.commit("add b, unsigned")
        report = rec.tick()
        assert "b" not in report.statuses and unsigned[:12] in (report.statuses["a"].held or "")
        state_repo.write("desired/c.yaml", job("c", SLEEP))
        gpg_commit("add c")
        report = rec.tick()
        assert "b" in launched(report) and "c" in report.statuses and report.statuses["a"].held is None
    finally:
        subprocess.run(["gpgconf", "--kill", "all"], env=env, capture_output=True, check=False)  # the signer's agent


def test_the_decision_is_pure() -> None:
    trust = advance(Trust(), Verdict("a" * 40, True, "no signatures were required"))
    held = advance(trust, judge("b" * 40, "N"))
    assert act_on("h" * 40, trust) == "h" * 40 and act_on("h" * 40, held) == "a" * 40
    assert "bbbbbbbbbbbb is held: it is not signed" in (hold_note(held) or "")
    assert judge("c" * 40, "U", "SHA256:xyz").reason == "it is signed by a key that is not allowed (SHA256:xyz)"
    assert act_on("h" * 40, advance(held, judge("c" * 40, "G", signer="alice"))) == "h" * 40


def test_keys_on_the_daemons_machine_are_read_again_on_every_check(state_repo: StateRepoFixture, local_workdir: Path,
                                                                   tmp_path: Path) -> None:
    need("ssh-keygen")
    alice, mallory = ssh_key(tmp_path, "alice"), ssh_key(tmp_path, "mallory")
    machine = tmp_path / "etc" / "allowed_signers"
    machine.parent.mkdir()
    machine.write_text(f"alice@example.com {(alice.with_suffix('.pub')).read_text()}")
    settings = (state_repo.path / "reconciler.yaml").read_text()
    state_repo.write("reconciler.yaml", settings + f"signatures:\n  allowed_signers: {machine}\n")
    ssh_commit(state_repo, "require signed changes", alice)
    state_repo.write("desired/a.yaml", job("a", SLEEP))
    ssh_commit(state_repo, "add a", alice)
    rec = Reconciler(state_repo.path)
    assert launched(rec.tick()) == {"a"}
    state_repo.write("desired/m.yaml", job("m", SLEEP))
    ssh_commit(state_repo, "add m", mallory)
    assert "m" not in rec.tick().statuses
    # The machine's administrator allows mallory's key: the same commit acts at the next tick.
    machine.write_text(machine.read_text() + f"mallory@example.com {(mallory.with_suffix('.pub')).read_text()}")
    report = rec.tick()
    assert launched(report) == {"m"} and report.statuses["a"].held is None


def test_a_rewritten_history_without_signatures_is_judged_with_the_last_trusted_keys(
        signed_repo: tuple[StateRepoFixture, Path, Path], local_workdir: Path) -> None:
    repo, alice, _mallory = signed_repo
    repo.write("desired/a.yaml", job("a", SLEEP))
    trusted = ssh_commit(repo, "add a", alice)
    assert launched(Reconciler(repo.path).tick()) == {"a"}
    # Someone replaces the branch with a history of their own that never asked for signatures.
    settings = (repo.path / "reconciler.yaml").read_text().split("signatures:")[0]
    repo.git("checkout", "-q", "--orphan", "rewritten")
    repo.git("rm", "-rq", "--cached", ".")
    repo.write("reconciler.yaml", settings)
    repo.write("desired/evil.yaml", job("evil", SLEEP))
    evil = ssh_commit(repo, "no signatures here", None)
    repo.git("branch", "-M", "rewritten", "main")
    # A restarted daemon (nothing in memory) still judges it with the keys of the last trusted change.
    report = Reconciler(repo.path).tick()
    assert "evil" not in report.statuses and not launched(report)
    assert report.commit == trusted and evil[:12] in (report.statuses["a"].held or "")
    # A change signed by an allowed key on top of the new history is acted on.
    repo.write("desired/b.yaml", job("b", SLEEP))
    ssh_commit(repo, "add b, signed", alice)
    assert "b" in launched(Reconciler(repo.path).tick())
