"""Operating the fleet: the ``reach`` CLI, process wiring (``runner``), fleet status and dead
letters (``fleet``), agent users and broker policy, the tables they print (``table``), the demo
and what it ships in the package (``demo``, ``demo_assets/``)."""
