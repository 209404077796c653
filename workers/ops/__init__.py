"""Operating the fleet, the functions the ``reach`` command (``workers.cli``) and the console
call: starting the roles in this process (``startup``: router, pools, beat; ``workflow_runner``),
the processes of a fleet on one machine (``local_fleet``: demo, tests, benchmarks), fleet status
and dead letters (``fleet``), approval decisions, agent users and broker policy, what operators do
to workflow runs (``workflow_commands``), the tables they print (``table``), the demo and what it
ships in the package (``demo``, ``demo_assets/``)."""
