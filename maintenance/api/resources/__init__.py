"""The operations API's resources, one module each, over :mod:`maintenance.api.dependencies`.

- ``dead_letters`` — ``/v1/core/dead-letters``: list, detail, replay, discard (one or in bulk);
- ``executions`` — ``/v1/core/executions``: the read-only list and detail of durable executions;
- ``resolutions`` — ``POST /v1/core/executions/{id}/resolve``, served only in admin mode.

A resource imports the shared dependencies and the operations layer (``maintenance/operations/``),
never a sibling resource; ``maintenance/api/app.py`` mounts their routers.
"""
