"""Approval receipts where the tool runs: the check at execution (`checks`) and finding the key
they are signed with (`signing_key`). The receipt itself (what a decision allows, signed) is
`broker.domain.receipts`.
"""
