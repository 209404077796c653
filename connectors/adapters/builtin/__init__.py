"""The built-in connector types as plugins: each module is an entry point of the group
``agent_reach.adapters`` in agent-reach's own pyproject.toml, with a ``manifest`` and a ``build``
as a third party's plugin has (connectors/adapters/plugin.py). Each imports its adapter (and the
adapter's library: zeep, SQLAlchemy, ...) only when a connector of its type is built. Their
settings are the connector's own keys (endpoint, wsdl, dsn_env, url_env, agent), so they declare
no ``config`` models. ``fixtures.py`` points the conformance kit at a fake system of their kind."""
