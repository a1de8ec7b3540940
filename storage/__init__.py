"""gpubot's persistence: SQLModel tables, the database factory, repositories, the audit log.

Depends on rules/ for the domain vocabulary and never on bot/.
"""
