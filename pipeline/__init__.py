import sys

if sys.argv[:1] == ["-m"]:  # `python -m pipeline.<stage>`, while its module is found and its package imported
    from pipeline import exits

    exits.guard_start()  # a Ctrl-C from here on is one line, not a traceback of the imports
