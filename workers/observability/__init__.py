"""What operators see: Prometheus metrics, the audit trail (``reach trace``), OpenTelemetry spans,
liveness/readiness probes, and the redaction of sensitive values before anything is kept."""
