"""`spec.matrix`: a Job expands into one member Job per combination, as GitHub Actions does, and a
bad matrix is one error naming the file and field while the other jobs go on."""

from __future__ import annotations

import pytest

from desired.matrix import MAX_MEMBERS, member_name
from desired.parse import parse_desired

OTHER = "kind: Job\nmetadata: {name: other}\nspec: {command: [sleep, '1']}\n"


def sweep(matrix: str, command: str = '[python, train.py, "--lr=${{ matrix.lr }}"]', extra: str = "",
          name: str = "sweep") -> str:
    return f"""
kind: Job
metadata: {{name: {name}}}
spec:
  command: {command}
  matrix: {matrix}
{extra}
"""


def members(text: str) -> dict[str, dict[str, str]]:
    state = parse_desired({"desired/sweep.yaml": text})
    assert not state.errors, state.errors
    return {name: {k.removeprefix("RECONCILER_MATRIX_").lower(): v for k, v in job.spec.env.items()
                   if k.startswith("RECONCILER_MATRIX_")} for name, job in state.jobs.items()}


def test_the_lists_multiply_in_the_order_written_and_each_member_is_named_from_its_values() -> None:
    state = parse_desired({"desired/sweep.yaml": sweep("{lr: [0.001, 0.01], seed: [1, 2]}")})
    assert list(state.jobs) == ["sweep-lr-0-001-seed-1", "sweep-lr-0-001-seed-2",
                                "sweep-lr-0-01-seed-1", "sweep-lr-0-01-seed-2"]
    assert state.sweep_of == dict.fromkeys(state.jobs, "sweep")
    assert list(state.sweeps["sweep"].members) == list(state.jobs)
    assert all(state.job_files[n] == "desired/sweep.yaml" for n in state.jobs)
    assert "sweep" not in state.jobs  # the sweep itself runs nothing


def test_command_and_env_values_are_substituted_and_every_value_is_in_the_environment() -> None:
    text = sweep("{lr: [0.001], seed: [7], fast: [true]}",
                 command='[python, train.py, "--lr=${{ matrix.lr }}", "${{matrix.seed}}"]',
                 extra='  env: {TAG: "run-${{ matrix.seed }}-${{ matrix.fast }}", PLAIN: "1"}')
    job = parse_desired({"desired/sweep.yaml": text}).jobs["sweep-lr-0-001-seed-7-fast-true"]
    assert job.spec.command == ["python", "train.py", "--lr=0.001", "7"]
    assert job.spec.env == {"TAG": "run-7-true", "PLAIN": "1", "RECONCILER_MATRIX_LR": "0.001",
                            "RECONCILER_MATRIX_SEED": "7", "RECONCILER_MATRIX_FAST": "true"}
    assert job.spec.matrix is None


def test_exclude_removes_partial_matches_and_include_follows_github_actions() -> None:
    """GitHub's own example (docs: "Expanding or adding matrix configurations"), with an exclude."""
    text = sweep("""
    fruit: [apple, pear]
    animal: [cat, dog, cow]
    exclude: [{animal: cow}]
    include:
      - {color: green}
      - {color: pink, animal: cat}
      - {fruit: apple, shape: circle}
      - {fruit: banana}
      - {fruit: banana, animal: cat}""", command="[echo, '${{ matrix.fruit }}']")
    assert list(members(text).values()) == [
        {"fruit": "apple", "animal": "cat", "color": "pink", "shape": "circle"},
        {"fruit": "apple", "animal": "dog", "color": "green", "shape": "circle"},
        {"fruit": "pear", "animal": "cat", "color": "pink"},
        {"fruit": "pear", "animal": "dog", "color": "green"},
        {"fruit": "banana"},
        {"fruit": "banana", "animal": "cat"},
    ]


def test_a_member_without_a_key_only_others_have_gets_an_empty_substitution() -> None:
    text = sweep("{lr: [0.1], include: [{lr: 0.5, opt: adam}]}",
                 command='[train, "--lr=${{ matrix.lr }}", "--opt=${{ matrix.opt }}"]')
    jobs = parse_desired({"desired/sweep.yaml": text}).jobs
    assert [j.spec.command for j in jobs.values()] == [["train", "--lr=0.1", "--opt="],
                                                       ["train", "--lr=0.5", "--opt=adam"]]


def test_names_are_valid_short_and_depend_on_the_member_s_own_values_only() -> None:
    assert member_name("sweep", {"lr": 0.001, "seed": 1}) == "sweep-lr-0-001-seed-1"
    assert member_name("s", {"model": "ResNet-50"}) == "s-model-resnet-50"
    # Values that do not read back from the name get a digest of the values: -1 and 1 stay apart.
    negative, positive = member_name("s", {"offset": -1}), member_name("s", {"offset": 1})
    assert positive == "s-offset-1" and negative.startswith("s-offset-1-") and len(negative) == len("s-offset-1") + 9
    long = member_name("a" * 60, {"path": "x" * 100})
    assert len(long) == 63 and long == member_name("a" * 60, {"path": "x" * 100})
    assert long != member_name("a" * 60, {"path": "x" * 99 + "y"})
    # A sibling added to the matrix renames no member: the names before are kept.
    before = members(sweep("{lr: [0.1, 0.2]}"))
    after = members(sweep("{lr: [0.1, 0.2, 0.3, '0_1']}"))
    assert set(before) < set(after)


def test_a_changed_value_changes_only_that_member_s_run_id() -> None:
    def run_ids(matrix: str) -> dict[str, str]:
        return {n: j.run_id() for n, j in parse_desired({"desired/s.yaml": sweep(matrix)}).jobs.items()}

    before, after = run_ids("{lr: [0.1, 0.2], max_parallel: 1}"), run_ids("{lr: [0.1, 0.3], max_parallel: 2}")
    assert before["sweep-lr-0-1"] == after["sweep-lr-0-1"]
    assert "sweep-lr-0-2" not in after and "sweep-lr-0-3" in after
    assert len(set(before.values()) | set(after.values())) == 3


@pytest.mark.parametrize(("matrix", "field", "needle"), [
    ("{lr: []}", "spec.matrix.lr", "empty list makes no members"),
    ("{lr: [[1, 2]]}", "spec.matrix.lr.0", "not a plain value"),
    ("{lr: [{a: 1}]}", "spec.matrix.lr.0", "not a plain value"),
    ("{lr: [null]}", "spec.matrix.lr.0", "not a plain value"),
    ("{lr: [.inf]}", "spec.matrix.lr.0", "not a finite number"),
    ("{lr: 0.1}", "spec.matrix", "must name a list of values"),
    ("{lr: [0.1], max-parallel: 2}", "spec.matrix", "did you mean `max_parallel`?"),
    ("{lr: [0.1], max_parallel: 0}", "spec.matrix.max_parallel", "greater than or equal to 1"),
    ("{'l r': [0.1]}", "spec.matrix", "is not a valid key"),
    ("{lr: [0.1], include: [{lr: [1]}]}", "spec.matrix.include.0.lr", "not a plain value"),
    ("{lr: [0.1], exclude: [{lrr: 0.1}]}", "spec.matrix.exclude.0", "did you mean `lr`?"),
    ("{lr: [0.1], exclude: [{lr: 0.1}]}", "spec.matrix", "every combination is excluded"),
    ("{lr: [0.1], LR: [1]}", "spec.matrix", "both be passed as RECONCILER_MATRIX_LR"),
    ("{lr: [0.1, 0.1]}", "spec.matrix", "would both be named sweep-lr-0-1"),
    ("{lr: [a, A]}", "spec.matrix", "would both be named sweep-lr-a"),
    ("{lr: [0.1], include: [{opt: a}, {opt: a, lr: 9}, {lr: 9, opt: a}]}", "spec.matrix", "would both be named"),
    ("{lr: [0.1], seed: [1]}\n  env: {RECONCILER_MATRIX_SEED: '2'}", "spec.env.RECONCILER_MATRIX_SEED",
     "set for each member from the matrix"),
])
def test_a_bad_matrix_is_an_error_naming_file_and_field_and_the_other_jobs_go_on(
        matrix: str, field: str, needle: str) -> None:
    state = parse_desired({"desired/sweep.yaml": sweep(matrix), "desired/other.yaml": OTHER})
    assert list(state.jobs) == ["other"] and not state.sweeps
    assert state.errors and all(e.file == "desired/sweep.yaml" and e.document == 1 for e in state.errors)
    assert any(e.field == field and needle in e.message for e in state.errors), state.errors


def test_a_reference_to_a_key_the_matrix_lacks_names_the_item_and_the_closest_key() -> None:
    text = sweep("{lr: [0.1], seed: [1]}", command='[train, "${{ matrix.seed }}", "${{ matrix.lrr }}"]',
                 extra='  env: {OPT: "${{ matrix.opt }}"}')
    said = {e.field: e.message for e in parse_desired({"desired/sweep.yaml": text}).errors}
    assert said["spec.command.2"] == ("`${{ matrix.lrr }}` names no key of the matrix (it has lr, seed); "
                                      "did you mean `lr`?")
    assert said["spec.env.OPT"].startswith("`${{ matrix.opt }}` names no key of the matrix")


def test_a_reference_in_a_job_without_a_matrix_is_an_error() -> None:
    text = "kind: Job\nmetadata: {name: plain}\nspec: {command: [train, '${{ matrix.lr }}']}\n"
    state = parse_desired({"desired/plain.yaml": text})
    assert not state.jobs
    assert [(e.field, e.message) for e in state.errors] == [
        ("spec.command.1", "`${{ matrix.lr }}` is used but the job has no `matrix`; add one or write the value")]


def test_more_members_than_the_cap_is_an_error_saying_the_cap() -> None:
    values = list(range(MAX_MEMBERS + 1))
    state = parse_desired({"desired/sweep.yaml": sweep(f"{{seed: {values}}}", command="[train]")})
    assert not state.jobs
    assert [e.message for e in state.errors] == [
        f"the matrix makes {MAX_MEMBERS + 1:,} members; at most {MAX_MEMBERS:,} are allowed: shorten its lists or "
        "split the job into several"]
    many = "{" + ", ".join(f"k{i}: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]" for i in range(12)) + "}"
    huge = parse_desired({"desired/sweep.yaml": sweep(many, command="[train]")})  # 10**12: refused, never built
    assert "1,000,000,000,000 combinations" in huge.errors[0].message


def test_a_member_named_like_another_job_or_a_sweep_named_like_a_job_is_refused() -> None:
    clash = OTHER.replace("name: other", "name: sweep-lr-0-1")
    state = parse_desired({"desired/a.yaml": clash, "desired/b.yaml": sweep("{lr: [0.1, 0.2]}")})
    assert list(state.jobs) == ["sweep-lr-0-1"] and not state.sweeps
    assert "member sweep-lr-0-1 of this sweep is already defined in desired/a.yaml" in state.errors[0].message
    same = parse_desired({"desired/a.yaml": sweep("{lr: [0.1]}"), "desired/b.yaml": OTHER.replace("other", "sweep")})
    assert list(same.jobs) == ["sweep-lr-0-1"]
    assert [(e.file, e.field) for e in same.errors] == [("desired/b.yaml", "metadata.name")]
    assert "already defined in desired/a.yaml" in same.errors[0].message


def test_max_parallel_is_kept_on_the_sweep_and_changes_no_run() -> None:
    one = parse_desired({"desired/s.yaml": sweep("{lr: [0.1], max_parallel: 3}")})
    assert one.sweeps["sweep"].max_parallel == 3
    other = parse_desired({"desired/s.yaml": sweep("{lr: [0.1]}")})
    assert other.sweeps["sweep"].max_parallel is None
    assert one.jobs["sweep-lr-0-1"].run_id() == other.jobs["sweep-lr-0-1"].run_id()
