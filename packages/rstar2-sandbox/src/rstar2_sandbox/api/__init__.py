"""HTTP endpoints: native (/v1), Code Judge compatible and SandboxFusion compatible."""
