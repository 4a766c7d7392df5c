from maintenance.cli import run

run()
