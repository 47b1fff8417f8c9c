"""verl-async-rm's test and demo rig: verl's real trainer on CPU (``cpu_backend``), a loopback judge
service (``judge_server``) and the demos. Not needed to use the product (``verl_async_rm``); the product
never imports it (tests/package/test_package.py holds that from the import graph)."""
