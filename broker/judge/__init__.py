"""Where a decision is judged: `deciding.Deciding`, the one judge every channel decides through,
and the decision that also remembers a rule.
"""
