"""The command line, on top of everything (nothing imports it): `imagepipe` is cli.main:console_main.

main.py      the commands' dispatch        parser.py    every command and option
run.py       run                           predict.py   predict
cloud.py     compile, submit, schedule     history.py   report, runs, export-schema
data.py      sample-data, cache            common.py    exit statuses, configuration, one-line failures
"""
