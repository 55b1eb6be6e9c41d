from django.db import models


class Bonus(models.Model):
    """The leaderboard close's effect: +10 coins for a top-3 member, once a week."""

    member = models.CharField(max_length=50)
    week = models.CharField(max_length=20)
    coins = models.IntegerField(default=10)


class Receipt(models.Model):
    """A task's effect."""

    order_id = models.IntegerField()
