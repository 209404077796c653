"""The router role: raw message -> intent (``intake``) -> checks in contract order -> dispatch or
answer (``routing``). ``Router.decide`` is pure; ``RouterRuntime`` carries decisions out."""
