"""SOAP adapter: one semantic action -> one WSDL operation called with zeep -> one Outcome.

The WSDL (a local path or an http(s) URL) is loaded once per process, on first use, and shared by
every thread; ``endpoint`` replaces the service address it names. Params become the operation's
input parts by name (a field's ``name`` is the part's own name); zeep and lxml set every value as
element text, so nothing an agent sends is ever spliced into the XML. A value XML cannot carry, a
part the operation lacks or a wrong type is refused before sending (VALIDATION_FAILED).

Every HTTP exchange goes through one httpx client with the connector's auth (any
``connectors.adapters.auth.build_auth`` kind, since httpx runs its auth flow on each request) and TLS context
(``mtls``): zeep's requests session would need each auth kind written twice. Answers are bounded
like the http adapter's (``max_response_bytes``, the action's timeout over the whole exchange),
parsed without DTDs or entities, and documents the WSDL imports must come from where the WSDL
itself is (its own origin, or local files for a local WSDL).

``data`` is the operation's result as plain JSON: a dict result as it is, anything else as
``{"result": value}``; decimals become strings (exact: money must not turn into a binary float),
dates and times ISO 8601 strings, binary base64. An answer nested deeper than ``max_depth`` keeps
its success with ``data`` replaced by an ``{"_reach_omitted": ...}`` marker, as in the http adapter.

Faults: a Client / Sender fault is DOWNSTREAM_VALIDATION_FAILED with the fault string as message;
any other fault is DOWNSTREAM_ERROR. HTTP 401/403 is DOWNSTREAM_AUTH_FAILED, 429
DOWNSTREAM_RATE_LIMITED; an answer that is not SOAP is DOWNSTREAM_ERROR for a 5xx, else
DOWNSTREAM_CONTRACT_VIOLATION. As in the http adapter: no connection (or no WSDL) is
DOWNSTREAM_UNREACHABLE with ``sent`` False; no answer in time after sending is DOWNSTREAM_TIMEOUT
when the action is safe to repeat (``ConnectorSpec.safe_to_repeat``), else OUTCOME_UNKNOWN.

Modules: adapter.py (SoapAdapter and its error mapping), exchange.py (zeep's transport over httpx),
wsdl.py (what of the WSDL is kept), values.py (results as JSON), checks.py (``reach validate``).
"""

from connectors.adapters.soap.adapter import SoapAdapter
from connectors.adapters.soap.checks import wsdl_problems
from connectors.adapters.soap.wsdl import WsdlError

__all__ = ["SoapAdapter", "WsdlError", "wsdl_problems"]
