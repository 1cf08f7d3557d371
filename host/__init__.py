"""Several models on one host (`onnxpool serve` on a file with `[models.<name>]` tables).

What plans, starts and routes several models lives here: the budgets and how the kernel holds
them (budget.py, priority.py), the host process (controller.py), supervisord's configuration and
calls (supervisor.py), how each supervised program starts (program.py), the front door's nginx
files (front_door.py, route_by_model.js), the host's files (state.py) and the host's routes
(routes.py). docs/ARCHITECTURE.md, "Several models on one host", says who supervises what.
"""
