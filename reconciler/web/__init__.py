"""The status page: `reconciler serve` shows every job's phase, progress, ETA and cost, and per job
its attempt timeline, progress over time, status commits and log tail, read from the same git
status and run storage the loop uses. Server-rendered (Starlette, Jinja2, SVG drawn on the server);
no JavaScript, nothing loaded from elsewhere. `serving` runs uvicorn for everything the daemon
serves over HTTP (the page, the webhook of `hook`, the metrics), with its limits and log lines."""
