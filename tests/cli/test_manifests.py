"""Bad manifests get one clear error naming the file; the other jobs still reconcile."""

from __future__ import annotations

import json
import sys

import pytest

from desired.parse import MAX_FILE_BYTES, parse_desired
from reconciler.daemon.loop import Reconciler
from status.models import Phase
from tests import zygote
from tests.conftest import StateRepoFixture

GOOD = """
apiVersion: reconciler.dev/v1
kind: Job
metadata: {name: good}
spec:
  command: ["sleep", "30"]
"""


def job_named(name: str) -> str:
    return GOOD.replace("name: good", f"name: {json.dumps(name)}")


@pytest.mark.parametrize(
    ("text", "field", "needle"),
    [
        (GOOD.replace("command:", "comand:"), "spec.comand", "unknown field"),
        (job_named("../x"), "metadata.name", "not a valid name"),
        (job_named("Train"), "metadata.name", "not a valid name"),
        (job_named("a;rm -rf /"), "metadata.name", "not a valid name"),
        (job_named("$(reboot)"), "metadata.name", "not a valid name"),
        (GOOD + "  env: {RECONCILER_EPOCH: '9'}\n", "spec.env", "reserved"),
        (job_named("x\n"), "metadata.name", "not a valid name"),
        (job_named("good\n"), "metadata.name", "not a valid name"),
        (GOOD + "  env: {\"LR\\n\": '1'}\n", "spec.env", "not a valid environment variable name"),
        (GOOD + "  secrets: [RECONCILER_EPOCH]\n", "spec.secrets", "reserved"),
        (GOOD + "  secrets: [RECONCILER_RUN_URI]\n", "spec.secrets", "reserved"),
        (GOOD + "  secrets: [\"TOKEN\\n\"]\n", "spec.secrets", "not a valid environment variable name"),
        (GOOD + "  env: {TOKEN: x}\n  secrets: [TOKEN]\n", "spec", "both env and secrets"),
        (GOOD + "  placement: {providers: [\"local\\n\"]}\n", "spec.placement.providers", "not a valid name"),
        (GOOD + "  budget_usd: .inf\n", "spec.budget_usd", "finite"),
        (GOOD.replace("Job", "Jobb"), "kind", "unknown kind"),
    ],
)
def test_invalid_manifest_names_file_document_and_field(text: str, field: str, needle: str) -> None:
    state = parse_desired({"desired/bad.yaml": text, "desired/ok.yaml": GOOD.replace("good", "fine")})
    assert "fine" in state.jobs
    assert state.errors and all(e.file == "desired/bad.yaml" and e.document == 1 for e in state.errors)
    assert any(e.field == field and needle in str(e) for e in state.errors), state.errors


def test_a_misspelt_kind_hides_no_other_error_of_the_file() -> None:
    text = GOOD.replace("kind: Job", "kind: Jobb").replace("command:", "comand:") + "  target_step: 3\n"
    state = parse_desired({"desired/bad.yaml": text})
    said = {e.field: e.message for e in state.errors}
    assert "did you mean `Job`?" in said["kind"]
    assert said["spec.comand"] == "unknown field; did you mean `command`?"
    assert said["spec.target_step"] == "unknown field; did you mean `target_steps`?"
    assert not state.jobs  # the kind is still wrong: nothing of it is run


def test_a_misspelt_field_is_named_as_written_with_the_closest_known_one() -> None:
    provider = "kind: Provider\nmetadata: {name: box}\nspec: {settings: {type: local, workdirr: /x}}\n"
    retry = GOOD + "  retry: {max_retires: 3}\n  colour: blue\n"
    state = parse_desired({"desired/p.yaml": provider, "desired/j.yaml": retry}, "tick_second: 5\n")
    said = {e.field: e.message for e in state.errors}
    assert said["spec.settings.workdir" + "r"] == "unknown field; did you mean `workdir`?"  # no union tag
    assert said["spec.retry.max_retires"] == "unknown field; did you mean `max_retries`?"
    assert said["tick_second"] == "unknown field; did you mean `tick_seconds`?"
    assert "check the spelling" in said["spec.colour"]  # nothing close: no guess


def test_yaml_alias_bomb_is_refused_without_expanding() -> None:
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
        for p, c in zip("abcdefgh", "bcdefghi", strict=True)
    )
    state = parse_desired({"desired/bomb.yaml": bomb, "desired/ok.yaml": GOOD})
    assert "good" in state.jobs
    assert [e.file for e in state.errors] == ["desired/bomb.yaml"]
    assert "aliases are not allowed" in str(state.errors[0])


def test_ten_megabyte_file_is_refused_by_size() -> None:
    big = GOOD + "#" + "x" * (10 * 1024 * 1024) + "\n"
    state = parse_desired({"desired/big.yaml": big, "desired/ok.yaml": GOOD})
    assert "good" in state.jobs
    assert state.errors[0].file == "desired/big.yaml"
    assert f"limit is {MAX_FILE_BYTES}" in str(state.errors[0])


def test_duplicate_job_name_is_an_error_on_the_second_file() -> None:
    state = parse_desired({"desired/a.yaml": GOOD, "desired/b.yaml": GOOD})
    assert list(state.jobs) == ["good"]
    assert state.errors[0].file == "desired/b.yaml" and "already defined in desired/a.yaml" in str(state.errors[0])


def test_run_identity_changes_with_what_is_computed_only() -> None:
    base = parse_desired({"d/a.yaml": GOOD}).jobs["good"]
    moved = parse_desired({"d/a.yaml": GOOD + "  placement: {providers: [local]}\n  retry: {max_retries: 9}\n"})
    changed = parse_desired({"d/a.yaml": GOOD.replace('"30"', '"31"')})
    env = parse_desired({"d/a.yaml": GOOD + "  env: {LR: '0.1'}\n"})
    assert moved.jobs["good"].run_id() == base.run_id()
    assert changed.jobs["good"].run_id() != base.run_id()
    assert env.jobs["good"].run_id() != base.run_id()


def test_broken_files_do_not_stop_other_jobs_in_a_real_tick(state_repo: StateRepoFixture) -> None:
    state_repo.write("desired/good.yaml", GOOD)
    state_repo.write("desired/typo.yaml", GOOD.replace("good", "typo").replace("command:", "comand:"))
    state_repo.write("desired/bomb.yaml", "a: &a [1]\nb: [*a, *a]\n")
    state_repo.write("desired/huge.yaml", "#" + "x" * (10 * 1024 * 1024))
    state_repo.commit("jobs, some broken")
    report = Reconciler(state_repo.path).tick()
    assert report.statuses["good"].phase == Phase.LAUNCHING
    assert any("desired/typo.yaml" in e and "spec.comand" in e for e in report.errors)
    assert any("desired/bomb.yaml" in e for e in report.errors)
    assert any("desired/huge.yaml" in e for e in report.errors)
    index = (state_repo.path / "status" / "README.md").read_text()
    assert "desired/typo.yaml" in index and "| good |" in index


def test_validate_command_exits_1_and_names_file_and_field(state_repo: StateRepoFixture) -> None:
    state_repo.write("desired/typo.yaml", GOOD.replace("command:", "comand:"))
    res = zygote.run([sys.executable, "-m", "reconciler", "validate", "--repo", str(state_repo.path)],
                     capture_output=True, text=True)
    assert res.returncode == 1
    assert "desired/typo.yaml" in res.stderr and "spec.comand" in res.stderr
    assert "Traceback" not in res.stderr
    state_repo.write("desired/typo.yaml", GOOD)
    ok = zygote.run([sys.executable, "-m", "reconciler", "validate", "--repo", str(state_repo.path)],
                    capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr


def test_schema_command_prints_json_schema_of_job_and_provider() -> None:
    res = zygote.run([sys.executable, "-m", "reconciler", "schema"], capture_output=True, text=True, check=True)
    doc = json.loads(res.stdout)
    assert set(doc) == {"Job", "Provider", "Settings"}
    assert "spec" in doc["Job"]["properties"]


PROVIDER = """
apiVersion: reconciler.dev/v1
kind: Provider
metadata: {name: box}
spec:
  settings:
    type: ssh
    hosts: [{name: h1, address: 203.0.113.10, user: alice}]
"""


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("name: box", 'name: "box\\n"', "metadata.name"),
        ("name: h1", 'name: "h1\\n"', "spec.settings.ssh.hosts.0.name"),
        ("user: alice", 'user: "alice\\n"', "spec.settings.ssh.hosts.0.user"),
        ("address: 203.0.113.10", "address: -oProxyCommand=touch", "spec.settings.ssh.hosts.0.address"),
        ("address: 203.0.113.10", 'address: "host\\n"', "spec.settings.ssh.hosts.0.address"),
        ("  settings:", "  secrets: [RECONCILER_EPOCH]\n  settings:", "spec.secrets"),
    ],
)
def test_provider_names_hosts_and_users_must_match_in_full(old: str, new: str, field: str) -> None:
    assert old in PROVIDER
    state = parse_desired({"desired/p.yaml": PROVIDER.replace(old, new), "desired/ok.yaml": GOOD})
    assert "good" in state.jobs and "box" not in state.providers
    assert any(e.file == "desired/p.yaml" and e.field == field for e in state.errors), state.errors


def test_provider_with_full_names_and_an_ipv6_host_is_accepted() -> None:
    text = PROVIDER.replace("203.0.113.10", "'[2001:db8::1]'") + "  secrets: [VAST_API_KEY]\n"
    state = parse_desired({"desired/p.yaml": text})
    assert not state.errors and "box" in state.providers


@pytest.mark.parametrize("text", ["identity: \"abc\\n\"\n", "commit_name: \"bot\\nmallory\"\n",
                                  "tick_seconds: .inf\n", "a: 1\na: 2\n",
                                  "[" * 200 + "]" * 200, "tick_seconds: " + "9" * 5000 + "\n"])
def test_hostile_settings_file_is_an_error_naming_reconciler_yaml(text: str) -> None:
    state = parse_desired({"desired/ok.yaml": GOOD}, text)
    assert "good" in state.jobs
    assert state.errors and all(e.file == "reconciler.yaml" for e in state.errors), state.errors


def test_errors_count_documents_as_the_file_does_empty_ones_included() -> None:
    state = parse_desired({"desired/a.yaml": "---\n---\n" + GOOD + "---\n" + GOOD.replace("command:", "comand:")})
    assert {e.document for e in state.errors} == {3}  # counted as 2 before


HOSTED_PROVIDER = """
apiVersion: reconciler.dev/v1
kind: Provider
metadata: {name: kag}
spec: {settings: {type: kaggle, username: me}}
"""
JOB_ON_KAG = """
apiVersion: reconciler.dev/v1
kind: Job
metadata: {name: train}
spec: {command: [python, train.py], placement: {providers: [kag]}}
"""


def test_a_hosted_provider_with_local_disk_storage_is_refused_naming_both() -> None:
    for settings, named in (("", "the default storage (a folder on the daemon's machine)"),
                            ("storage: file://~/.reconciler/runs\n", "storage 'file://~/.reconciler/runs'")):
        state = parse_desired({"desired/p.yaml": HOSTED_PROVIDER, "desired/j.yaml": JOB_ON_KAG}, settings)
        messages = [str(e) for e in state.errors]
        assert any(f"kaggle provider 'kag' cannot use {named}" in m for m in messages), messages
        assert any("provider kag is refused (see its error)" in m for m in messages)
        assert "kag" not in state.providers
    ok = parse_desired({"desired/p.yaml": HOSTED_PROVIDER, "desired/j.yaml": JOB_ON_KAG}, "storage: s3://b/runs\n")
    assert not ok.errors and ok.providers["kag"].spec.type == "kaggle"


@pytest.mark.parametrize("storage", ["local:///srv/runs", "LOCAL:///srv/runs", "File:///srv/runs", "/srv/runs",
                                     "~/runs", "simplecache::file:///srv/runs", "memory://runs"])
def test_every_spelling_of_this_machines_disk_is_refused_for_a_hosted_provider(storage: str) -> None:
    state = parse_desired({"desired/p.yaml": HOSTED_PROVIDER, "desired/j.yaml": JOB_ON_KAG}, f"storage: '{storage}'\n")
    assert any(f"kaggle provider 'kag' cannot use storage {storage!r}" in str(e) for e in state.errors)
    assert "kag" not in state.providers


@pytest.mark.parametrize("path", ["/", "//", "/./", "/..", " "])
def test_a_code_path_of_the_filesystem_root_is_refused(path: str) -> None:
    job = JOB_ON_KAG.replace("placement: {providers: [kag]}", f"code: {{path: '{path}'}}")
    state = parse_desired({"desired/j.yaml": job})
    assert "train" not in state.jobs
    assert any("is the root of the filesystem" in str(e) and "spec.code.path" in str(e) for e in state.errors)


@pytest.mark.parametrize("name", ["AWS_SECRET_ACCESS_KEY", "KAGGLE_KEY", "HF_TOKEN", "DB_PASSWORD"])
def test_a_credential_in_env_is_refused_with_the_way_to_name_it_as_a_secret(name: str) -> None:
    job = JOB_ON_KAG.replace("placement: {providers: [kag]}", f"env: {{{name}: abc}}")
    state = parse_desired({"desired/j.yaml": job})
    assert len(state.errors) == 1 and f"{name} holds a credential: name it under `secrets:`" in str(state.errors[0])
    moved = JOB_ON_KAG.replace("placement: {providers: [kag]}", f"secrets: [{name}]")
    assert not parse_desired({"desired/j.yaml": moved}).errors


def after_files(after: dict[str, list[str]]) -> dict[str, str]:
    """One file per job, each with a second job beside it that names nothing."""
    return {f"desired/{name}.yaml": job_named(name) + f"  after: {json.dumps(names)}\n---\n" + job_named(f"{name}-too")
            for name, names in after.items()}


CYCLE = "`after` makes a cycle, so none of these jobs could start: {}; remove one of these from `after`"


@pytest.mark.parametrize(("after", "bad", "message"), [
    ({"prepare": [], "train": ["prepar"]}, ["train"], "no job named prepar is defined; did you mean `prepare`?"),
    ({"train": ["zzz"]}, ["train"],
     "no job named zzz is defined; name a job of this repository or remove it from `after`"),
    ({"train": ["train"]}, ["train"], "a job cannot run after itself; remove train from `after`"),
    ({"a": ["b"], "b": ["a"]}, ["a", "b"], CYCLE.format("a waits for b, which waits for a")),
    ({"a": ["c"], "b": ["a"], "c": ["b"], "d": ["a"]}, ["a", "b", "c"],
     CYCLE.format("a waits for c, which waits for b, which waits for a")),
    ({"x": [], "train": ["x", "x"]}, ["train"], "x is named more than once; name each job once"),
])
def test_after_naming_an_unknown_job_itself_or_a_cycle_is_an_error_of_those_jobs_alone(
        after: dict[str, list[str]], bad: list[str], message: str) -> None:
    state = parse_desired({**after_files(after), "desired/ok.yaml": GOOD})
    assert [(e.file, e.field, e.message) for e in state.errors] == [
        (f"desired/{name}.yaml", "spec.after", message) for name in bad]
    assert set(state.jobs) == {"good"} | {f"{n}-too" for n in after} | set(after) - set(bad)


def test_a_job_whose_after_names_a_job_of_a_broken_file_says_that_file_defines_none() -> None:
    state = parse_desired({"desired/a.yaml": job_named("a").replace("command:", "comand:"),
                           **after_files({"b": ["a"]})})
    said = {e.file: e.message for e in state.errors}
    assert said["desired/b.yaml"] == ("no job named a is defined (a manifest with errors defines none); name a job of "
                                      "this repository or remove it from `after`")


def test_a_cycle_holds_its_jobs_in_a_real_tick_and_validate_names_them(state_repo: StateRepoFixture) -> None:
    for path, text in {**after_files({"a": ["b"], "b": ["a"]}), "desired/good.yaml": GOOD}.items():
        state_repo.write(path, text)
    state_repo.commit("a cycle")
    report = Reconciler(state_repo.path).tick()
    assert sorted(report.statuses) == ["a-too", "b-too", "good"]  # a and b are neither started nor failed
    assert {st.phase for st in report.statuses.values()} <= {Phase.LAUNCHING, Phase.PENDING}
    assert any("desired/a.yaml field spec.after" in e and "a waits for b" in e for e in report.errors)
    res = zygote.run([sys.executable, "-m", "reconciler", "validate", "--repo", str(state_repo.path)],
                     capture_output=True, text=True)
    assert res.returncode == 1
    assert "desired/b.yaml field spec.after: `after` makes a cycle" in " ".join(res.stderr.split())
