"""Operating the fleet: the ``reach`` CLI, process wiring (``runner``), fleet status and dead
letters (``fleet``), agent users and broker policy, the demo."""
