"""Stage 4, refresh: estimate each page's change rate λ, split the budget by policy, due times."""
