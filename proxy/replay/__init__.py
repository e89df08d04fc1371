"""`looptrace replay` and `looptrace export`: recorded sessions read back from the trace store, run
again against another server (scored teacher-forced, or decoded afresh step by step) and stored as
sessions of their own, or exported token-exact for training and evaluation."""
