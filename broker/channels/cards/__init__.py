"""Telegram's and Discord's chat cards: compact button tokens and the answer options a card
offers.
"""
