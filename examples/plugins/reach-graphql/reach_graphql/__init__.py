"""reach-graphql: a GraphQL connector type for agent-reach, as a plugin outside the core.

plugin.py holds what the fleet registers (the manifest and ``build``), adapter.py the adapter,
server.py a small GraphQL server over HTTP on graphql-core (the kit's fake system and the tests'
real one), kit.py the conformance fixture ``reach plugins check graphql`` runs, demo.py the product
API of the tests and of the plugin's scene in ``reach demo``.
"""
