"""Replay: a recording through the real engine against a simulated cluster, with a report.

:func:`~controller.offline.replay.replayer.replay` runs the open loop; :mod:`.inventory` infers the
starting cluster when no scenario is given; :mod:`.summary` defines what is measured;
:mod:`.timeline` keeps bounded time series; :mod:`.report` writes ``summary.json`` and
``report.html``; :mod:`.source` reads recordings fast, exactly as ``read_events`` does.
"""
