"""Running the jobs: ``runner`` (one run of each job, `core-jobs run-once`), ``scheduler`` (`core-jobs
serve`: every job on its crontab), ``http`` (serve's /healthz and /metrics), ``telemetry`` (the
runs' metrics and the Pushgateway). Above the jobs and the settings, beside the API: docs/deployment.md.
"""
