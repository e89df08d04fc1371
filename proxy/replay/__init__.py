"""`looptrace replay`: a recorded session read back from the trace store, run again against another
server (scored teacher-forced, or decoded afresh step by step), compared, and stored as a session of
its own. (`looptrace export` is export/'s.)"""
