"""`oceanus tune MODEL`: measure a model's configurations on this machine and recommend one.

    space.py          the settings tried, and a candidate as a config
    target.py         the server: started here or reached at --url, driven over HTTP
    loadgen.py        the built-in closed-loop load generator
    perf_analyzer.py  NVIDIA's perf_analyzer, when installed
    measure.py        one measurement: client percentiles + the server's statistics
    sweep.py          the search within the time budget, and the side-by-side check
    frontier.py       the throughput/latency frontier and the choice within the budget
    plots.py          inline SVG charts
    report.py         the HTML report
    output.py         config.pbtxt, CSV, JSON, report, --apply
    cli.py            the command line

docs/tune.md describes how it searches and what it writes.
"""
