"""What a deadline policy costs the planner: CPU time per call of
reconciler.planner.outlook.deadline.choose, the rules (the default) against `deadline_policy:
lookahead`, on the same situations.

The situations are the ones the real tick hands the policy in bench/deadline.py's runs (a job of W
hours of compute, a deadline at 1.1, 1.5 and 2 x W, spot on a synthetic trace and on-demand,
ticks of 300 s), recorded while the lookahead decides. Each is then decided by both policies,
`--repeat` times, timed by CPU time (the box is shared: wall time would measure the neighbours).
The lookahead solves a table of at most MAX_STEPS layers a call (two calls when it stops a
worker), so its cost grows with the window until the window is cut into longer steps, and with
the work left, and with the room states: two, or up to eight where the daemon has seen short room
periods on spot (RoomWatch). So the lookahead is timed twice on each situation: with memoryless room
(spot's short share 0, two room states), and with spot's short share set to SHORT_SHARE, as
RoomWatch learns on the AWS traces and near the share a new daemon starts from
(reliability.PRIOR_SHORT_SHARE; the cost depends on whether the share is 0, not on its value).

    python bench/policy_cost.py --quick     # W = 8 h, 2 traces, under a minute
    python bench/policy_cost.py             # W = 8 h and 24 h, 3 traces

Prints a markdown table, then one line: lookahead_ms_per_call=X lookahead_vs_rules=Y
lookahead_short_ms_per_call=Z (the mean over every situation, the ratio of the two policies' means,
and the lookahead's mean with short room periods).
"""

from __future__ import annotations

import argparse
import logging
import time
from dataclasses import replace
from statistics import mean

import deadline as bench  # bench/deadline.py: run as a script, bench/ is on the path

from reconciler.planner.outlook.deadline import Choice, Situation, choose
from reconciler.planner.outlook.reliability import RoomShape
from reconciler.sim.driver import JobPlan, SimConfig, Simulation


def situations(case: bench.Case) -> list[Situation]:
    """Every situation the tick hands the lookahead over one run, in order."""
    seen: list[Situation] = []

    def spy(s: Situation) -> Choice:
        seen.append(s)
        return choose(replace(s, lookahead=True))

    logging.getLogger("reconciler").setLevel(logging.CRITICAL)
    job = JobPlan("job", target_steps=case.target_steps, model=bench.model(), max_retries=1000,
                  deadline_seconds=case.deadline)
    sim = Simulation(SimConfig(providers=bench.providers(case), jobs=[job], seed=case.seed, tick_seconds=bench.TICK,
                               placement_policy=spy))
    for _ in range(int(case.deadline / bench.TICK) + 40):
        sim.step()
        if not sim.repo.unpushed and sim.all_settled():
            break
    sim.close()
    return [s for s in seen if s.deadline is not None and s.remaining_steps]


SHORT_SHARE = 0.3  # spot's short share in the lookahead's second timing (RoomWatch learns 0.03-0.52 on AWS)


def with_rooms(s: Situation, share: float) -> Situation:
    """The same situation with spot's short share of room periods set, room settled now."""
    return replace(s, options=tuple(replace(o, room_shape=RoomShape(share)) if o.interruptible else o
                                    for o in s.options))


def cpu_seconds(s: Situation, lookahead: bool, repeat: int) -> float:
    """CPU seconds of one call, the least of `repeat` (the others paid for what ran beside it)."""
    s = replace(s, lookahead=lookahead)
    best = float("inf")
    for _ in range(repeat):
        t = time.process_time()
        choose(s)
        best = min(best, time.process_time() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="W = 8 h, 2 traces")
    ap.add_argument("--hours", type=float, nargs="+", help="W, hours of compute (default 8 with --quick, else 8 24)")
    ap.add_argument("--traces", type=int, help="synthetic traces a deadline (default 2 with --quick, else 3)")
    ap.add_argument("--repeat", type=int, default=3, help="calls a situation, per policy (the least counts)")
    a = ap.parse_args()
    hours_set = a.hours or ((8.0,) if a.quick else (8.0, 24.0))
    seeds = range(1, 1 + (a.traces or (2 if a.quick else 3)))
    rows, rules_all, ahead_all, short_all = [], [], [], []
    for hours in hours_set:
        length = max(bench.DEADLINES) * hours * 3600.0 + 40 * bench.TICK
        for ratio in bench.DEADLINES:
            found = [s for seed in seeds for s in situations(
                bench.Case(hours, ratio, bench.synthetic_trace(seed, length), False, seed))]
            rules = [cpu_seconds(s, False, a.repeat) for s in found]
            ahead = [cpu_seconds(with_rooms(s, 0.0), True, a.repeat) for s in found]
            short = [cpu_seconds(with_rooms(s, SHORT_SHARE), True, a.repeat) for s in found]
            rules_all += rules
            ahead_all += ahead
            short_all += short
            rows.append(f"| {hours:g} h | {ratio:g} W | {len(found)} | {1e6 * mean(rules):.0f} | "
                        f"{1e3 * mean(ahead):.1f} | {1e3 * max(ahead):.1f} | {mean(ahead) / mean(rules):.0f}x | "
                        f"{1e3 * mean(short):.1f} | {1e3 * max(short):.1f} |")
    print("| W | deadline | situations | rules, µs a call | lookahead, ms a call | lookahead, slowest | "
          "lookahead / rules | with short room periods, ms a call | with short room periods, slowest |")
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print()
    ratio = mean(ahead_all) / mean(rules_all)
    print(f"lookahead_ms_per_call={1e3 * mean(ahead_all):.1f} lookahead_vs_rules={ratio:.0f} "
          f"lookahead_short_ms_per_call={1e3 * mean(short_all):.1f}")


if __name__ == "__main__":
    main()
