"""Operating the fleet, the functions the ``reach`` command (``workers.cli``) and the console
call: process wiring (``runner``, ``processes``), fleet status and dead letters (``fleet``),
approval decisions, agent users and broker policy, the tables they print (``table``), the demo
and what it ships in the package (``demo``, ``demo_assets/``)."""
