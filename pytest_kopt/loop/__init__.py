"""The optimization loop (SKILL.md): the run directory's state, the agent's methods, the decisions of a close and
the summary. Plain Python over gate records and artifacts; the pytest controller calls :mod:`.session`."""
