"""What runs on the machines around a relay: clients of its APIs, and the receiver.

Nothing here imports the relay's server side; the two share only the wire values in
:mod:`melchior.mellan.rawjson` and :mod:`melchior.mellan.outcome`.
"""
