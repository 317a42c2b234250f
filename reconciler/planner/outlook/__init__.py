"""Time and money: where a job should run now and why, what finishing will take and cost.

One entry, `where.where_to_run`, is what the rest of the planner asks when it places a run; it
combines placement (placement.py), the outlook and forecast shown (view.py, forecast.py), the
failure rates learned per provider (reliability.py) and the job's placement policy (deadline.py).
Pure.
"""
