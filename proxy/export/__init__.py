"""`looptrace export`: recorded steps token-exact, for training and evaluation."""
