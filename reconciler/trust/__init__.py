"""What is trusted (signed commits) and what never is (secrets, untrusted text shown)."""
